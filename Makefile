# Developer entry points. Only bash, make, Python 3.11 (or python3) and, for
# the Django 6.0 passes, a Python 3.12 needed: everything else is installed
# into .venv and .venv-django6 by scripts/venv.sh.
#
#   make test               the four test passes: Django 5.2 and 6.0, each on
#                           SQLite, then PostgreSQL (see scripts/run-tests)
#   make test ARGS="-k foo" extra arguments go to pytest
#   make demo               migrate and run the shop demo (honours DATABASE_URL)
#   make clean              remove the virtualenvs, .test-results and the demo's SQLite files

SHELL := /bin/bash
PYTHON_VENV := .venv/bin/python
ARGS ?=

.PHONY: test demo clean venv venv-main

# Phony on purpose: venv.sh itself decides (by a hash of pyproject.toml and
# the pip arguments) whether anything needs doing, which a file timestamp
# could not. `venv` makes all three virtualenvs (the tests need them);
# `venv-main` only .venv, which is all the demo, the benchmarks and the
# chaos suite use.
venv:
	@bash scripts/venv.sh

venv-main:
	@bash scripts/venv.sh .venv

test: venv
	bash scripts/run-tests $(ARGS)

demo: venv-main
	$(PYTHON_VENV) manage.py migrate --noinput
	$(PYTHON_VENV) manage.py shop_demo

clean:
	rm -rf .venv .venv-django6 .venv-soniq-0.2 .test-results
	find example_project -name '*.sqlite3' -type f -delete

# Benchmarks (not tests; see docs/performance.md). They use the local
# PostgreSQL (127.0.0.1:5432, or BENCH_DATABASE_URL), create their own
# soniq_bench_<pid>_* databases and drop them at the end. The peers go into
# bench/.venv-peers. BENCH_ARGS passes options to `python -m bench.run`.
#   make bench              full run (~15 min on 2 cores), medians of 3
#   make bench-quick        smaller N, one repetition (~3 min)
BENCH_ARGS ?=

.PHONY: bench bench-quick

bench: venv-main
	@bash bench/peers-venv.sh
	$(PYTHON_VENV) -m bench.run $(BENCH_ARGS)

bench-quick: venv-main
	@bash bench/peers-venv.sh
	$(PYTHON_VENV) -m bench.run --quick $(BENCH_ARGS)

# Cost vs. queue depth (10k, 100k, 1M queued with scheduled and finished rows
# mixed in), beside 100k waiting dependents (issue 29; --waiting N, 0: none)
# and beside 100k keyed jobs held back over 1,000 keys (issue 31; --keyed N, 0: none)
# and vs. worker processes (1, 2, 4, 8): soniq_django alone, one
# database soniq_bench_<pid>_scale, no peers. SCALE_ARGS passes options to
# `python -m bench.scale` (see docs/performance.md#scale).
#   make bench-scale        full run (~11 min on 2 cores; under 20)
#   make bench-scale-quick  10k and 100k, fewer rows and calls, P up to 4 (~3 min)
SCALE_ARGS ?=

.PHONY: bench-scale bench-scale-quick

bench-scale: venv-main
	$(PYTHON_VENV) -m bench.scale $(SCALE_ARGS)

bench-scale-quick: venv-main
	$(PYTHON_VENV) -m bench.scale --quick $(SCALE_ARGS)

# Limits per key (bench/keys.py, docs/keys.md): a claim beside 100,000 held-back keyed
# jobs over 1,000 keys against one without, a keyed claim, and quiet keys' wait beside
# a busy key of 10,000 jobs (~2 min).
.PHONY: bench-keys
bench-keys: venv-main
	$(PYTHON_VENV) -m bench.keys $(KEYS_BENCH_ARGS)

# Claims beside 10M finished rows kept for their result, against none (issue 27;
# docs/performance.md#finished-rows): part 2 of bench.scale alone, ~15 min and
# ~5 GB of disk while it runs.
.PHONY: bench-finished

bench-finished: venv-main
	$(PYTHON_VENV) -m bench.scale --no-depth --no-workers --finished 10000000 $(SCALE_ARGS)

# The admin at a million rows (issue 28; docs/performance.md#the-admin-at-a-million-rows):
# one database soniq_bench_<pid>_admin with 1,000,000 jobs in mixed states and
# 100,000 dead letters; every admin page an operator uses requested in-process
# through Django's test client, median and max per page against 300 ms, and the
# SQL queries each one runs (~2 min, ~700 MB of disk while it runs). ADMIN_ARGS
# passes options to `python -m bench.admin` (--jobs, --dead, --repeat, --sql, --keep).
ADMIN_ARGS ?=
.PHONY: bench-admin

bench-admin: venv-main
	$(PYTHON_VENV) -m bench.admin $(ADMIN_ARGS)

# Chaos suite (tests/chaos/; see docs/reliability.md). Starts its own
# throwaway PostgreSQL cluster (initdb/pg_ctl, a free port under /tmp),
# restarts it on purpose and deletes it at the end. Short versions of the
# four runs are part of `make test`. CHAOS_ARGS passes options to the plain,
# effects and workflows runs, e.g. CHAOS_ARGS="--seed 42"; CHAOS_LIVENESS_ARGS
# to the liveness run, e.g. "--rounds 5".
#   make chaos              the five full runs, one after the other (~15 min)
#   make chaos-plain        5,000 jobs, 4 workers, kills and restarts (~3 min)
#   make chaos-effects      5,000 atomic jobs writing one effect row each, kills,
#                           restarts, SIGSTOP past the lease, terminated backends
#                           (~4 min); exactly one effect row per job
#   make chaos-liveness     a worker's running jobs through a locked settings row,
#                           a lost COMMIT and a SIGSTOPped backend, 3 rounds each
#                           (~2 min); each job runs once, other queues flow
#   make chaos-keys         300 jobs over 10 keys at key_concurrency=1, 3 workers, kills,
#                           a SIGSTOP past the lease, terminated backends, a restart,
#                           retries and timeouts: never two runs of a key at once (~1 min)
#   make chaos-keys-sqlite  the same scenario on a SQLite file (the key triggers' twin):
#                           3 workers, SIGKILLs, a SIGSTOP past the lease, retries and
#                           timeouts (no server to restart) (~30 s); CHAOS_SQLITE_ARGS
#   make chaos-workflows    10 batches of 200 with a callback and 1,500 jobs in a
#                           random DAG of dependencies, kills, restarts, SIGSTOP,
#                           terminated backends (~3 min); each callback once and
#                           after its members, no dependent early, failed jobs'
#                           dependents cancelled
#   make chaos-steps        100 jobs of 5 atomic durable steps, each writing one
#                           effect row, kills, restarts, SIGSTOP, terminated
#                           backends (~1 min); each (job, step) effect exactly once,
#                           no step function called after its record committed
#   make chaos-fleet        3,000 jobs on one queue, drained by soniq_worker and the
#                           reference Node worker (contrib/node-worker, worker grant
#                           only), 600 of a name only Node knows; Node workers
#                           SIGKILLed and SIGSTOPped past the lease, Python workers
#                           SIGKILLed, Node backends terminated (~3 min); nothing
#                           dead-lettered, one effect per job; CHAOS_FLEET_ARGS
CHAOS_ARGS ?=
CHAOS_LIVENESS_ARGS ?=
CHAOS_FLEET_ARGS ?=
CHAOS_SQLITE_ARGS ?=

.PHONY: chaos chaos-plain chaos-effects chaos-liveness chaos-workflows chaos-steps chaos-keys chaos-keys-sqlite chaos-fleet

chaos: chaos-plain chaos-effects chaos-liveness chaos-workflows chaos-steps chaos-keys chaos-keys-sqlite chaos-fleet

chaos-plain: venv-main
	$(PYTHON_VENV) -m tests.chaos $(CHAOS_ARGS)

chaos-effects: venv-main
	$(PYTHON_VENV) -m tests.chaos --effects $(CHAOS_ARGS)

chaos-liveness: venv-main
	$(PYTHON_VENV) -m tests.chaos --liveness $(CHAOS_LIVENESS_ARGS)

chaos-workflows: venv-main
	$(PYTHON_VENV) -m tests.chaos --workflows $(CHAOS_ARGS)

chaos-steps: venv-main
	$(PYTHON_VENV) -m tests.chaos --steps $(CHAOS_ARGS)

chaos-keys: venv-main
	$(PYTHON_VENV) -m tests.chaos --keys $(CHAOS_ARGS)

chaos-keys-sqlite: venv-main
	$(PYTHON_VENV) -m tests.chaos.sqlite_keys $(CHAOS_SQLITE_ARGS)

chaos-fleet: venv-main
	$(PYTHON_VENV) -m tests.fleet.chaos $(CHAOS_FLEET_ARGS)

# Soak run (bench/soak.py; see docs/performance.md#hours-of-load). Starts its own
# throwaway PostgreSQL cluster with stock settings (autovacuum on) under /tmp,
# measures the maximum enqueue+drain rate briefly, then enqueues at half of it
# and drains for SOAK_ARGS' --minutes (30), printing one row a minute, the
# targets and their verdicts. CSV, text report and plot go to bench/results/.
# The plot needs matplotlib, which bench/plot-venv.sh puts into bench/.venv-plot
# (never the project's virtualenv).
#   make soak               30 minutes
#   make soak-quick         3 minutes: a smoke test (the verdicts compare single minutes)
#   make soak SOAK_ARGS="--minutes 60 --rate 500 --workers 1 --concurrency 8"
SOAK_ARGS ?=

# Pinned horizon (issue 27; docs/performance.md#a-pinned-horizon): the soak with a
# REPEATABLE READ snapshot held 15 minutes after 5 minutes of load, then 10 more
# minutes (30 in all); one worker process at concurrency 8. PIN_ARGS passes options.
#   make bench-pin          the full run (~31 min)
#   make bench-pin PIN_ARGS="--pin-start 2 --pin-minutes 3 --pin-after 2"   a short one
# bench-pin-standby: the same, the snapshot held on a streaming standby of the run's
# cluster with hot_standby_feedback = on (bench/pinning.py); same PIN_ARGS.
.PHONY: soak soak-quick bench-pin bench-pin-standby

soak: venv-main
	@bash bench/plot-venv.sh
	$(PYTHON_VENV) -m bench.soak $(SOAK_ARGS)

bench-pin: venv-main
	@bash bench/plot-venv.sh
	$(PYTHON_VENV) -m bench.soak --pin-minutes 15 --workers 1 --concurrency 8 $(PIN_ARGS)

bench-pin-standby: venv-main
	@bash bench/plot-venv.sh
	$(PYTHON_VENV) -m bench.soak --pin-minutes 15 --workers 1 --concurrency 8 --pin-via standby $(PIN_ARGS)

soak-quick: venv-main
	@bash bench/plot-venv.sh
	$(PYTHON_VENV) -m bench.soak --minutes 3 $(SOAK_ARGS)
