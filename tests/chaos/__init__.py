"""Chaos suite: real worker processes drain jobs while workers are SIGKILLed and
PostgreSQL is restarted (fast and immediate shutdown); a checker then proves
from the database that nothing was lost, completed twice, or overwritten by a
stale fence.

The effects scenario runs atomic jobs (``@job(atomic=True)``), each writing one
row to an effects table inside its job's transaction, while the driver also
SIGSTOPs a worker past its lease and terminates worker backends; the checker
then also proves exactly one effect row per job, from the generation whose
completion landed, and none from a refused run.

- ``python -m tests.chaos`` (``make chaos-plain``): the full plain run;
  ``python -m tests.chaos --effects`` (``make chaos-effects``): the full
  effects run; ``make chaos``: both.
- tests/chaos/test_chaos_short.py: the short version of each, inside the test suite.

Modules: cluster (the private PostgreSQL), driver (workers, kills, restarts,
stops, terminated backends), checker (the proof), jobs (the recording
handler), effects (the atomic effects handler), prepare, schema, settings.
"""
