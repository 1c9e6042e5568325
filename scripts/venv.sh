#!/usr/bin/env bash
# Create or refresh the project virtualenv at .venv and install the package
# with its test extras (`pip install -e '.[test]'`).
#
# - The interpreter is $PYTHON if set, else python3.11 if present, else python3.
# - A venv whose python (or pip) does not run is deleted and recreated.
# - pip runs again only when pyproject.toml changed since the last successful
#   install: .venv/.soniq-install-stamp holds the sha256 of pyproject.toml,
#   written only after pip succeeded, so an interrupted install is retried.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

venv=.venv
stamp=$venv/.soniq-install-stamp

if [[ -n "${PYTHON:-}" ]]; then
    base_python=$PYTHON
elif command -v python3.11 >/dev/null 2>&1; then
    base_python=python3.11
elif command -v python3 >/dev/null 2>&1; then
    base_python=python3
else
    echo "venv.sh: neither python3.11 nor python3 found on PATH" >&2
    exit 1
fi

# A venv is usable when its interpreter starts and has pip. Anything else
# (half-created venv, base interpreter removed or upgraded away) is rebuilt.
if [[ -e $venv ]] && ! { "$venv/bin/python" -c 'import sys' && "$venv/bin/python" -m pip --version; } >/dev/null 2>&1; then
    echo "venv.sh: $venv is broken or incomplete; recreating it"
    rm -rf "$venv"
fi

if [[ ! -e $venv ]]; then
    echo "venv.sh: creating $venv with $(command -v "$base_python")"
    # An interrupted `python -m venv` leaves no working pip (ensurepip runs
    # last), which the check above catches on the next run.
    "$base_python" -m venv "$venv"
fi

want=$("$venv/bin/python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' pyproject.toml)
have=$(cat "$stamp" 2>/dev/null || true)

if [[ "$want" != "$have" ]]; then
    echo "venv.sh: installing soniq-django with test extras into $venv"
    rm -f "$stamp"
    "$venv/bin/python" -m pip install --disable-pip-version-check --quiet -e '.[test]'
    echo "$want" >"$stamp"
else
    echo "venv.sh: $venv is up to date"
fi
