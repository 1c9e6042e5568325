"""Chaos suite: real worker processes drain jobs while workers are SIGKILLed and
PostgreSQL is restarted (fast and immediate shutdown); a checker then proves
from the database that nothing was lost, completed twice, or overwritten by a
stale fence.

- ``python -m tests.chaos`` (or ``make chaos``): the full run.
- tests/chaos/test_chaos_short.py: the short run inside the test suite.

Modules: cluster (the private PostgreSQL), driver (workers, kills, restarts),
checker (the proof), jobs (the recording handler), prepare, schema, settings.
"""
