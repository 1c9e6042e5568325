"""Handlers of the steps tests: each step writes one ``Effect`` row (its ``note`` the step name).

Imported by tests/steps/conftest.py, so a worker thread of the tests finds them.
"""

import os
import time

from soniq_django import job
from soniq_django.worker import current_job
from tests.testapp.models import Effect


def effect(name: str, value: int = 0) -> dict:
    """One Effect row for step ``name`` of the running job; its result names it."""
    context = current_job()
    Effect.objects.create(job_id=context.job_id, generation=context.generation,
                          attempt=context.attempts, pid=os.getpid(), note=name)
    return {"step": name, "value": value}


@job(name="tests.steps.three", retries=5)
def three(atomic: bool = False, fail_before: str | None = None, fail_attempts: int = 1) -> list:
    """Three steps; raises before step ``fail_before`` on the first ``fail_attempts`` attempts."""
    context = current_job()
    results = []
    for i, name in enumerate(("a", "b", "c")):
        if name == fail_before and context.attempts <= fail_attempts:
            raise RuntimeError(f"failing before {name} on purpose")
        results.append(context.step(name, effect, name, value=i, atomic=atomic))
    return results


@job(name="tests.steps.async_three", retries=5)
async def async_three(atomic: bool = False, fail_before: str | None = None) -> list:
    """``three`` for async handlers: ``astep`` with a plain and with an ``async def`` function."""
    from asgiref.sync import sync_to_async

    context = current_job()

    async def aeffect(name: str, value: int = 0) -> dict:
        return await sync_to_async(effect)(name, value)

    results = []
    for i, name in enumerate(("a", "b", "c")):
        if name == fail_before and context.attempts == 1:
            raise RuntimeError(f"failing before {name} on purpose")
        fn = aeffect if i % 2 else effect
        results.append(await context.astep(name, fn, name, value=i, atomic=atomic))
    return results


@job(name="tests.steps.atomic_job", atomic=True, retries=5)
def atomic_job(fail: bool = False) -> list:
    """Steps inside an atomic job: savepoints of its transaction, committed with it."""
    context = current_job()
    got = [context.step("a", effect, "a", atomic=True), context.step("b", effect, "b")]
    if fail and context.attempts == 1:
        raise RuntimeError("failing the atomic job on purpose")
    return got


#: The worker a test runs (set by the test), whose flights a step can look at.
WORKER = None


def _held_write_lock() -> list:
    time.sleep(0.3)  # a few heartbeats (HEARTBEAT_SECONDS 0.1 in the tests)
    return [flight.holds_write_lock for flight in WORKER.flights.all()]


@job(name="tests.steps.held")
def held() -> list:
    """What the worker's flights say while an atomic step runs, and after it."""
    context = current_job()
    during = context.step("held", _held_write_lock, atomic=True)
    return [during, [flight.holds_write_lock for flight in WORKER.flights.all()]]


def _effect_then_lose_the_commit(name: str) -> dict:
    """``effect``; on attempt 1 the step's COMMIT after its record is lost in a partition."""
    from django.db import connection

    from tests.support.commits import cut_after

    if current_job().attempts == 1:
        cut_after(connection, "soniq_record_step(")
    return effect(name)


@job(name="tests.steps.lost_commit", retries=3)
def lost_commit() -> dict:
    """One atomic step whose first COMMIT never reaches the server (PostgreSQL)."""
    return current_job().step("a", _effect_then_lose_the_commit, "a", atomic=True)
