"""Handlers the tests enqueue; found by autodiscovery like any app's jobs."""

from soniq_django import job


@job(name="tests.add")
def add(a: int, b: int = 0) -> int:
    return a + b


@job(name="tests.unique_report", unique=True, queue="reports", retries=2)
def unique_report(day: str) -> str:
    return day


@job(name="tests.flexible")
def flexible(first, *rest, **extra):
    return [first, list(rest), extra]


@job(name="tests.positional_only")
def positional_only(a, /, b):
    return a + b


# --- Handlers for the worker tests (tests/test_worker*.py) ------------------
#
# Worker processes are separate, so handlers leave their traces where every
# process can see them: the job row (attempts, result) and, when the
# SONIQ_TEST_RUN_LOG environment variable names a file, one appended line per
# event ("<event> <job_id> <attempt> <pid> <unix time>"). Lines are written
# with one O_APPEND write each, so concurrent processes never interleave.

import asyncio  # noqa: E402
import os  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402

from soniq_django.errors import JobCancelled, PermanentFailure  # noqa: E402
from soniq_django.worker import current_job  # noqa: E402


def record(event: str, context=None) -> None:
    """Append one event of the current job (or ``context``'s) to the run log, if one is set."""
    path = os.environ.get("SONIQ_TEST_RUN_LOG")
    context = context or current_job()
    if not path or context is None:
        return
    line = f"{event} {context.job_id} {context.attempts} {os.getpid()} {time.time():.6f}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def _trace(**extra) -> dict:
    context = current_job()
    return {"job": context.job_id, "attempt": context.attempts, "pid": os.getpid(), **extra}


@job(name="tests.worker.ok")
def worker_ok(n: int = 0) -> dict:
    """Succeed at once; the result says which run finished the job."""
    started = time.time()
    record("start")
    return _trace(n=n, started=started)


@job(name="tests.worker.flaky", retries=5)
def worker_flaky(fail_times: int) -> dict:
    """Fail on the first ``fail_times`` attempts (the row's attempts counter), then succeed."""
    record("start")
    if current_job().attempts <= fail_times:
        raise RuntimeError(f"flaky failure on attempt {current_job().attempts}")
    return _trace()


@job(name="tests.worker.slow_flaky", retries=5)
def worker_slow_flaky(fail_times: int, seconds: float) -> dict:
    """``tests.worker.flaky``, sleeping ``seconds`` before each failure."""
    record("start")
    if current_job().attempts <= fail_times:
        time.sleep(seconds)
        raise RuntimeError(f"flaky failure on attempt {current_job().attempts}")
    return _trace()


@job(name="tests.worker.always_fails", retries=2)
def worker_always_fails(message: str = "boom") -> None:
    record("start")
    raise ValueError(message)


@job(name="tests.worker.fails_unencodable")
def worker_fails_unencodable() -> None:
    """Fail with a message holding a lone surrogate (bytes decoded with surrogateescape)."""
    record("start")
    raise ValueError("cannot read " + b"name-\xff".decode("utf-8", "surrogateescape"))


@job(name="tests.worker.null_budget", retries=1)
def worker_null_budget() -> None:
    """Always fails; enqueued with max_attempts=None it gets retries + 1 = 2 attempts."""
    record("start")
    raise RuntimeError("fails every time")


@job(name="tests.worker.permanent")
def worker_permanent() -> None:
    record("start")
    raise PermanentFailure("retrying cannot help")


@job(name="tests.worker.not_json")
def worker_not_json() -> object:
    record("start")
    return {"value": {1, 2, 3}}


@job(name="tests.worker.sleep")
def worker_sleep(seconds: float, first_attempt_only: bool = False) -> dict:
    """Sleep (uncooperatively); with ``first_attempt_only`` later attempts return at once."""
    record("start")
    if not first_attempt_only or current_job().attempts == 1:
        time.sleep(seconds)
    record("end")
    return _trace()


@job(name="tests.worker.cooperative")
def worker_cooperative(seconds: float = 30.0) -> dict:
    """Work in small steps for up to ``seconds``, stopping as soon as a cancel is requested."""
    record("start")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            current_job().raise_if_cancelled()
            time.sleep(0.01)
    except JobCancelled:
        record("saw-cancel")
        raise
    return _trace()


@job(name="tests.worker.async_ok")
async def worker_async_ok(n: int = 0) -> dict:
    record("start")
    await asyncio.sleep(0.01)
    return _trace(n=n, is_async=True)


@job(name="tests.worker.async_sleep")
async def worker_async_sleep(seconds: float) -> dict:
    record("start")
    await asyncio.sleep(seconds)
    return _trace()


@job(name="tests.worker.async_cooperative")
async def worker_async_cooperative(seconds: float = 30.0) -> dict:
    """``tests.worker.cooperative`` as an ``async def``: small awaits, stopping at a cancel."""
    record("start")
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            current_job().raise_if_cancelled()
            await asyncio.sleep(0.01)
    except JobCancelled:
        record("saw-cancel")
        raise
    return _trace()


#: Jobs of tests.worker.async_together that have started (reset by the test).
TOGETHER: list[str] = []


@job(name="tests.worker.async_together")
async def worker_async_together(expected: int, seconds: float = 5.0) -> dict:
    """Wait (up to ``seconds``) until ``expected`` of these jobs have started; say on which loop
    and thread it ran, and whether the others came."""
    record("start")
    TOGETHER.append(current_job().job_id)
    deadline = time.monotonic() + seconds
    while len(TOGETHER) < expected and time.monotonic() < deadline:
        await asyncio.sleep(0.005)
    return _trace(loop=id(asyncio.get_running_loop()), thread=threading.current_thread().name,
                  met=len(TOGETHER) >= expected)


@job(name="tests.worker.async_fails", retries=1)
async def worker_async_fails(message: str = "async boom") -> None:
    record("start")
    await asyncio.sleep(0)
    raise ValueError(message)


@job(name="tests.worker.touch_db")
def worker_touch_db(seconds: float = 0.0) -> dict:
    """Use this thread's database connection, then sleep: the connection stays open meanwhile."""
    from django.db import connection

    record("start")
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
    time.sleep(seconds)
    record("end")
    return _trace()


@job(name="tests.worker.wait_for_file")
def worker_wait_for_file(path: str, limit: float = 30.0) -> dict:
    """Block until ``path`` exists (the test's go signal, across processes), then succeed."""
    record("start")
    deadline = time.monotonic() + limit
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)
    return _trace()


@job(name="tests.worker.tcp_options")
def worker_tcp_options() -> dict:
    """The TCP options this job thread's own connection to the jobs database was opened with."""
    from django.db import connection

    connection.ensure_connection()
    names = ("keepalives", "keepalives_idle", "keepalives_interval", "keepalives_count",
             "tcp_user_timeout", "connect_timeout")
    return {key: value for key, value in connection.connection.info.get_parameters().items()
            if key in names}


@job(name="tests.worker.open_connections")
def worker_open_connections(seconds: float = 0.0) -> dict:
    """Say how many database connections this job thread holds open as the handler starts."""
    from django.db import connections

    record("start")
    held = sum(conn.connection is not None for conn in connections.all(initialized_only=True))
    time.sleep(seconds)
    return _trace(open=held)


# --- Atomic handlers (tests/worker/test_atomic.py) ---------------------------
#
# Each writes one Effect row naming its run (job id, generation) and then
# decides how the run ends. Nothing about them is idempotent: only the atomic
# option keeps a failed, refused or timed-out run's row out of the table.

from tests.testapp.models import Effect  # noqa: E402


def _effect(note: str) -> Effect:
    context = current_job()
    return Effect(job_id=context.job_id, generation=context.generation,
                  attempt=context.attempts, pid=os.getpid(), note=note)


def _wait_for(path: str, seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)


@job(name="tests.atomic.effect", atomic=True, retries=3)
def atomic_effect(fail_times: int = 0, hold: float = 0.0, hold_attempts: int | None = None,
                  gate: str | None = None, note: str = "", on_commit: str = "") -> dict:
    """Write an Effect; fail on the first ``fail_times`` attempts; hold, or wait for ``gate``.

    ``hold`` seconds (on the attempts up to ``hold_attempts``, or every one)
    and the ``gate`` file are waited for after the write, inside the job's
    transaction. ``on_commit="record"`` logs an "on-commit" event once the
    transaction commits; ``"raise"`` raises from that callback.
    """
    from django.db import transaction

    record("start")
    context = current_job()
    _effect(note).save()
    if on_commit:
        transaction.on_commit(  # after execute(): current_job() is None by then
            lambda: record("on-commit", context) if on_commit == "record" else 1 / 0)
    if context.attempts <= fail_times:
        raise RuntimeError(f"atomic failure on attempt {context.attempts}")
    if gate is not None:
        _wait_for(gate)
    if hold and (hold_attempts is None or context.attempts <= hold_attempts):
        time.sleep(hold)
    record("end")
    return {"generation": context.generation, "key": context.idempotency_key}


@job(name="tests.atomic.async_effect", atomic=True, retries=3)
async def atomic_async_effect(fail_times: int = 0) -> dict:
    """The async twin: its Effect written through Django's async ORM."""
    record("start")
    context = current_job()
    await _effect("async").asave()
    if context.attempts <= fail_times:
        raise RuntimeError(f"atomic async failure on attempt {context.attempts}")
    return {"generation": context.generation}


# --- Per-job time limits (tests/worker/test_timeouts.py) -----------------------


@job(name="tests.timeouts.short", timeout=1, retries=0)
def timeouts_short(seconds: float, first_attempt_only: bool = False) -> dict:
    """A plain function (it cannot be stopped) with a 1 s limit; see ``worker_sleep``."""
    record("start")
    if not first_attempt_only or current_job().attempts == 1:
        time.sleep(seconds)
    record("end")
    return _trace()


@job(name="tests.timeouts.long", timeout=5, retries=0)
def timeouts_long(seconds: float) -> dict:
    """A plain function with a 5 s limit, longer than the tests' JOB_TIMEOUT_SECONDS."""
    record("start")
    time.sleep(seconds)
    record("end")
    return _trace()


@job(name="tests.timeouts.async_short", timeout=1, retries=0)
async def timeouts_async_short(seconds: float) -> dict:
    record("start")
    try:
        await asyncio.sleep(seconds)
    except asyncio.CancelledError:
        record("cancelled")
        raise
    record("end")
    return _trace()


@job(name="tests.timeouts.async_blocking", timeout=1, retries=0)
async def timeouts_async_blocking(seconds: float) -> dict:
    """An ``async def`` that blocks its event loop (a sync sleep) past its 1 s limit."""
    record("start")
    time.sleep(seconds)
    record("end")
    return _trace()


@job(name="tests.timeouts.own_timeout_error", retries=0)
def timeouts_own_timeout_error() -> None:
    """A handler whose client gave up: its TimeoutError is its own failure, not the job's limit."""
    record("start")
    raise TimeoutError("the mail server did not answer")


@job(name="tests.timeouts.atomic", atomic=True, timeout=1, retries=3)
def timeouts_atomic(hold: float = 0.0, note: str = "") -> dict:
    """Write an Effect inside the job's transaction, then hold it ``hold`` s on attempt 1."""
    record("start")
    context = current_job()
    _effect(note).save()
    if context.attempts == 1:
        time.sleep(hold)
    record("end")
    return {"generation": context.generation}


# --- Bounded waits (tests/worker/test_liveness.py) -----------------------------

@job(name="tests.atomic.lost_commit", atomic=True, retries=3)
def atomic_lost_commit(note: str = "") -> dict:
    """Write an Effect; on attempt 1 the COMMIT after its completion is lost (PostgreSQL)."""
    from django.db import connection

    record("start")
    context = current_job()
    _effect(note).save()
    if context.attempts == 1:
        from tests.support.commits import cut_after

        cut_after(connection, "soniq_complete(")
    return {"generation": context.generation}


# Progress (docs/workflows.md#progress) -----------------------------------------


@job(name="tests.progress.steps")
def progress_steps(steps: int, pause: float = 0.0, note: str | None = None,
                   gate: str | None = None) -> dict:
    """Report ``steps`` values, 0..steps-1 of steps, ``pause`` s apart; then a last one.

    ``gate``: a file to wait for before the last report (the test reads progress meanwhile).
    """
    context = current_job()
    for done in range(steps):
        context.set_progress(done, steps, note)
        time.sleep(pause)
    if gate is not None:
        _wait_for(gate)
    context.set_progress(steps, steps, "finished")
    return {"steps": steps}


@job(name="tests.progress.async_steps")
async def progress_async_steps(steps: int) -> dict:
    context = current_job()
    for done in range(steps + 1):
        context.set_progress(done, steps)
        await asyncio.sleep(0.01)
    return {"steps": steps}


@job(name="tests.progress.atomic", atomic=True)
def progress_atomic(steps: int) -> dict:
    for done in range(steps + 1):
        current_job().set_progress(done, steps, "atomic")
    return {"steps": steps}
