"""A handler of "the next release": not in jobs.py, so only SONIQ["IMPORTS"] finds it.

Nothing in the test process imports this module: there, the job name has no
handler, as on a worker of the previous release (tests/worker/test_worker_processes.py).
"""

from soniq_django import job


@job(name="tests.rolling.added")
def added(word: str) -> str:
    return word.upper()
