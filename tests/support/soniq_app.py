"""Soniq's side of tests/test_soniq_interop.py: a ``Soniq`` instance with the test handlers.

The handlers carry the same job names as soniq_django's test handlers in
tests/testapp/jobs.py, so a row enqueued by either side can be run by
either side's worker. Like those, they append one line per start to the
file named by ``SONIQ_TEST_RUN_LOG`` (``start <job_id> <attempt> <pid>
<unix time>``), which tells the test which process ran which attempt.

``soniq worker tests.support.soniq_app:app`` runs Soniq's own worker on them, and
``python -m tests.support.soniq_app enqueue`` Soniq's own ``enqueue``; the database
is ``SONIQ_DATABASE_URL``. Both run in the environment of the Soniq release
under test (.venv holds 0.1.0, .venv-soniq-0.2 holds 0.2), so this module
runs unchanged on each and imports nothing but soniq; soniq_django never
imports it.
"""

import asyncio
import json
import os
import sys
import time

from soniq import JobContext, Soniq


def _record(ctx: JobContext) -> None:
    path = os.environ.get("SONIQ_TEST_RUN_LOG")
    if not path:
        return
    line = f"start {ctx.job_id} {ctx.attempt} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def make_app(database_url: str | None = None) -> Soniq:
    """A Soniq instance on ``database_url`` (default: ``SONIQ_DATABASE_URL``) with the handlers."""
    app = Soniq(database_url=database_url) if database_url else Soniq()

    @app.job(name="tests.worker.ok")
    async def ok(ctx: JobContext, n: int = 0) -> dict:
        _record(ctx)
        return {"n": n, "job": ctx.job_id, "attempt": ctx.attempt, "pid": os.getpid(),
                "by": "soniq"}

    @app.job(name="tests.worker.flaky", retries=5)
    async def flaky(ctx: JobContext, fail_times: int) -> dict:
        _record(ctx)
        if ctx.attempt <= fail_times:
            raise RuntimeError(f"flaky failure on attempt {ctx.attempt}")
        return {"job": ctx.job_id, "attempt": ctx.attempt, "pid": os.getpid(), "by": "soniq"}

    @app.job(name="tests.unique_report", unique=True, queue="reports", retries=2)
    async def unique_report(ctx: JobContext, day: str) -> str:
        _record(ctx)
        return day

    return app


app = make_app()


async def _enqueue_all(calls: list) -> list[str]:
    """``app.enqueue(name, **options)`` for each ``[name, options]`` of ``calls``."""
    soniq = make_app()
    try:
        return [await soniq.enqueue(name, **options) for name, options in calls]
    finally:
        await soniq.close()


if __name__ == "__main__":
    # python -m tests.support.soniq_app enqueue: a JSON list of [name, options] on
    # stdin; prints the job ids, as a JSON list, on the last line of stdout.
    if sys.argv[1:] != ["enqueue"]:
        sys.exit("usage: python -m tests.support.soniq_app enqueue < calls.json")
    print(json.dumps(asyncio.run(_enqueue_all(json.load(sys.stdin)))))
