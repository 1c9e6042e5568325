"""current_job().step(): looked up first, run once per job, recorded under the claim's fence."""

import datetime as dt
import json
import threading

import pytest
from django.db import connections
from django.utils import timezone
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st

from soniq_django import enqueue, get_job
from soniq_django.errors import (ConfigValidationError, ErrorCode, JobCancelled,
                                 StepNotRecorded)
from soniq_django.models import Job, JobStep
from soniq_django.owned import OwnedJobSource
from soniq_django.steps import recorded_steps, reset_steps
from soniq_django.steps.store import steps_for
from soniq_django.worker.context import JobContext, _current, bind
from tests.steps.handlers import effect
from tests.support.owned import claim, rewrite
from tests.support.workers import run_burst
from tests.testapp.models import Effect

pytestmark = [pytest.mark.django_db(transaction=True)]


def run_of(source, job_id=None) -> JobContext:
    """A claim of the next job as a run's context (what a worker's job thread has)."""
    claimed = claim(source)
    fence = claimed.claim_fence
    context = JobContext(job_id=fence.job_id, job_name=claimed.job_name, queue=claimed.queue,
                         attempts=claimed.attempts, max_attempts=claimed.max_attempts,
                         generation=fence.generation, _fence=fence, _using="default")
    bind(context)  # current_job() in this thread (unbound after the test)
    return context


@pytest.fixture(autouse=True)
def unbound():
    yield
    _current.set(None)


def lapse(job_id) -> None:
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))


def effects(job_id, name=None) -> int:
    rows = Effect.objects.filter(job_id=job_id)
    return (rows if name is None else rows.filter(note=name)).count()


@pytest.fixture
def source():
    return OwnedJobSource("default")


@pytest.mark.parametrize("atomic", [False, True])
def test_a_recorded_step_returns_its_result_and_is_not_run_again(source, atomic):
    job_id = enqueue("tests.steps.three", {})
    first = run_of(source)
    got = first.step("charge", effect, "charge", value=7, atomic=atomic)
    assert got == {"step": "charge", "value": 7}
    lapse(job_id)  # the run is lost; the next claim is a new run of the same job
    second = run_of(source)
    assert second.generation > first.generation
    calls = []
    assert second.step("charge", lambda: calls.append(1), atomic=atomic) == got
    assert calls == [] and effects(job_id) == 1
    (record,) = recorded_steps(job_id)
    assert (record.name, record.attempt, record.generation) == ("charge", 1, first.generation)
    assert record.size == len(json.dumps(got))  # as PostgreSQL prints jsonb: ", " and ": "


def test_a_job_retried_by_the_worker_resumes_after_its_recorded_steps():
    job_id = enqueue("tests.steps.three", {"fail_before": "c"})
    assert run_burst() == 0
    info = get_job(job_id)
    assert info.status == "done" and info.attempts == 2
    assert info.result == [{"step": n, "value": i} for i, n in enumerate("abc")]
    assert info.steps == ("a", "b", "c")
    assert [effects(job_id, n) for n in "abc"] == [1, 1, 1]  # a and b ran once, on attempt 1
    assert [r.attempt for r in recorded_steps(job_id)] == [1, 1, 2]


@pytest.mark.parametrize("atomic", [False, True])
def test_async_handlers_have_astep_with_plain_and_async_functions(atomic):
    job_id = enqueue("tests.steps.async_three", {"atomic": atomic, "fail_before": "b"})
    assert run_burst() == 0
    info = get_job(job_id)
    assert info.status == "done" and info.attempts == 2, info.last_error
    assert [effects(job_id, n) for n in "abc"] == [1, 1, 1]
    assert info.steps == ("a", "b", "c")


def test_steps_of_an_atomic_job_commit_with_it_or_not_at_all():
    job_id = enqueue("tests.steps.atomic_job", {"fail": True})
    assert run_burst() == 0
    info = get_job(job_id)
    assert info.status == "done" and info.attempts == 2
    # The first run's steps rolled back with its transaction: run again, once each in all.
    assert [effects(job_id, n) for n in "ab"] == [1, 1]
    assert {r.attempt for r in recorded_steps(job_id)} == {2}


def test_names_are_unique_within_a_run(source):
    enqueue("tests.steps.three", {})
    run = run_of(source)
    run.step("a", lambda: 1)
    with pytest.raises(ConfigValidationError) as raised:
        run.step("a", lambda: 2)
    assert raised.value.code is ErrorCode.STEP_DUPLICATE


@pytest.mark.parametrize("atomic", [False, True])
def test_a_result_that_is_not_json_is_refused_before_it_is_recorded(source, atomic):
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)
    with pytest.raises(ConfigValidationError) as raised:
        run.step("a", lambda: (effect("a"), {1, 2})[1], atomic=atomic)
    assert raised.value.code is ErrorCode.STEP_NOT_JSON
    assert "set" in raised.value.reason
    assert not JobStep.objects.filter(job_id=job_id).exists()
    assert effects(job_id) == (0 if atomic else 1)  # an atomic step's write rolled back


@pytest.mark.parametrize("atomic", [False, True])
def test_a_result_over_the_size_bound_is_refused_with_its_code(source, settings, atomic):
    settings.SONIQ = {**settings.SONIQ, "STEP_MAX_BYTES": 100}
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)
    with pytest.raises(ConfigValidationError) as raised:
        run.step("big", lambda: "x" * 200, atomic=atomic)
    assert raised.value.code is ErrorCode.STEP_TOO_LARGE
    assert "202 bytes" in raised.value.reason and "100" in raised.value.reason
    assert run.step("small", lambda: "x" * 98, atomic=atomic) == "x" * 98  # 100 bytes: kept
    # The database's own bound (a worker in another language): the same code.
    with pytest.raises(ConfigValidationError) as raised:
        steps_for("default").record(run._fence, "other", '"' + "x" * 99 + '"', 101, 100)
    assert raised.value.code is ErrorCode.STEP_TOO_LARGE
    assert [r.name for r in recorded_steps(job_id)] == ["small"]


@pytest.mark.parametrize("atomic", [False, True])
def test_a_run_whose_claim_lapsed_records_nothing(source, atomic):
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)
    lapse(job_id)
    with pytest.raises(StepNotRecorded) as raised:
        run.step("a", effect, "a", atomic=atomic)
    assert raised.value.code is ErrorCode.STEP_NOT_RECORDED
    assert effects(job_id) == 0 and not JobStep.objects.exists()  # looked up first: not run


@pytest.mark.postgresql_only
def test_an_atomic_step_whose_claim_lapses_while_it_runs_keeps_none_of_its_writes(source):
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)

    # The lease lapses, from another connection, while the step's function runs.
    def lapse_elsewhere():
        try:
            lapse(job_id)
        finally:
            connections.close_all()

    def fn():
        got = effect("a")
        t = threading.Thread(target=lapse_elsewhere)
        t.start()
        t.join()
        return got

    with pytest.raises(StepNotRecorded):
        run.step("a", fn, atomic=True)
    assert effects(job_id) == 0 and not JobStep.objects.exists()


@pytest.mark.parametrize("atomic", [False, True])
def test_a_cancel_requested_stops_the_record(source, atomic):
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)
    rewrite(job_id, cancel_requested=True)
    run._cancel().set()  # the heartbeat's notice
    with pytest.raises(JobCancelled):
        run.step("a", effect, "a", atomic=atomic)
    assert not JobStep.objects.exists()
    assert effects(job_id) == (0 if atomic else 1)


def test_steps_go_with_their_job_and_can_be_reset(source):
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)
    for name in "abc":
        run.step(name, lambda: name)
    lapse(job_id)
    with pytest.raises(Exception):
        reset_steps(job_id)  # processing (lapsed, not yet reaped): refused
    rewrite(job_id, status="queued", lease_expires_at=None, claim_token=None, claim_owner=None)
    assert reset_steps(job_id, ["b"]) == 1
    assert [r.name for r in recorded_steps(job_id)] == ["a", "c"]
    Job.objects.filter(id=job_id).delete()
    assert not JobStep.objects.filter(job_id=job_id).exists()


@hsettings(max_examples=40, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(name=st.one_of(st.text(max_size=210), st.integers(), st.none()))
def test_step_names_are_checked_before_anything_runs(name):
    from soniq_django.steps.run import MAX_NAME, checked_name

    good = (isinstance(name, str) and 1 <= len(name) <= MAX_NAME and "\x00" not in name
            and not any(0xD800 <= ord(c) <= 0xDFFF for c in name))
    if good:
        assert checked_name(name) == name
    else:
        with pytest.raises(ConfigValidationError) as raised:
            checked_name(name)
        assert raised.value.code is ErrorCode.CONFIG


def test_an_atomic_step_on_sqlite_tells_the_heartbeat_it_holds_the_write_lock():
    from soniq_django.worker import Worker
    from tests.steps import handlers
    from tests.support.workers import WorkerThread

    job_id = enqueue("tests.steps.held", {})
    handlers.WORKER = Worker(burst=True)
    try:
        assert WorkerThread(handlers.WORKER).start().join() == 0
    finally:
        handlers.WORKER = None
    during, after = get_job(job_id).result
    sqlite = connections["default"].vendor == "sqlite"
    assert during == [sqlite] and after == [False]  # PostgreSQL: no write lock to hold


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-2**62, 2**62)
    | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
              max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
                max_size=8), inner, max_size=4),
    max_leaves=12)


@pytest.mark.postgresql_only
@hsettings(max_examples=60, deadline=None,
           suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=_JSON)
def test_a_results_size_is_measured_as_postgresql_measures_it(value):
    # Python's check (STEP_MAX_BYTES) and soniq_record_step's (max_bytes) count alike:
    # the JSON text with ", " and ": " between items, as PostgreSQL prints jsonb.
    from soniq_django.steps.run import encoded

    text, size = encoded("s", value, 10**6)
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT octet_length(%s::jsonb::text)", [text])
        assert cursor.fetchone()[0] == size
