# Developer entry points. Only bash, make and Python 3.11 (or python3) needed:
# everything else is installed into .venv by scripts/venv.sh.
#
#   make test               both test passes (SQLite, then PostgreSQL)
#   make test ARGS="-k foo" extra arguments go to pytest
#   make demo               migrate and run the shop demo (honours DATABASE_URL)
#   make clean              remove .venv, .test-results and the demo's SQLite files

SHELL := /bin/bash
PYTHON_VENV := .venv/bin/python
ARGS ?=

.PHONY: test demo clean venv

# Phony on purpose: venv.sh itself decides (by a hash of pyproject.toml)
# whether anything needs doing, which a file timestamp could not.
venv:
	@bash scripts/venv.sh

test: venv
	bash scripts/run-tests $(ARGS)

demo: venv
	$(PYTHON_VENV) manage.py migrate --noinput
	$(PYTHON_VENV) manage.py shop_demo

clean:
	rm -rf .venv .test-results
	find example_project -name '*.sqlite3' -type f -delete
