"""soniq_django.testing: run_jobs(), immediate() and the fixtures, in each style of Django test.

Every class runs on both databases. ``TestCase`` keeps the whole test in one
transaction (on PostgreSQL every claim, lease and fenced write then happens
inside it); ``TransactionTestCase`` and ``django_db(transaction=True)``
commit for real; the pytest-django functions use the plugin's fixtures.
"""

import asyncio
import datetime as dt
import time

import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.db import connection, transaction
from django.test import TestCase, TransactionTestCase, override_settings
from django.utils import timezone

from example_project.shop.models import Order
from soniq_django import enqueue, get_job, job, signals
from soniq_django.errors import ConfigValidationError, ErrorCode, PermanentFailure, SoniqError
from soniq_django.models import DeadLetterJob, Job
from soniq_django.testing import arun_jobs, immediate, run_jobs, soniq_immediate, soniq_run_jobs
from soniq_django.worker import current_job

# The plugin's fixtures, imported as a project without the plugin would (the
# other way is pytest_plugins = ["soniq_django.testing"] in the root conftest).
__all__ = ["soniq_immediate", "soniq_run_jobs"]

NO_BACKOFF = {"RETRY_BASE_SECONDS": 0}


class Unreachable(Exception):
    """What the failing handlers raise."""


@job(name="tests.testing.order")
def make_order(email: str, amount_cents: int = 100) -> int:
    return Order.objects.create(email=email, amount_cents=amount_cents).pk


@job(name="tests.testing.flaky", retries=4)
def flaky(fail_times: int) -> int:
    if current_job().attempts <= fail_times:
        raise Unreachable(f"attempt {current_job().attempts}")
    return current_job().attempts


@job(name="tests.testing.fails", retries=2)
def always_fails() -> None:
    raise Unreachable("always")


@job(name="tests.testing.permanent")
def permanent() -> None:
    raise PermanentFailure("card declined")


@job(name="tests.testing.chain")
def chain(depth: int) -> int:
    if depth:
        chain.enqueue(depth=depth - 1)
    return depth


@job(name="tests.testing.bad_query")
def bad_query() -> None:
    Order.objects.create(email="kept@example.com", amount_cents=1)
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM no_such_table_here")


@job(name="tests.testing.atomic_order", retries=4, atomic=True)
def atomic_order(email: str, fail_times: int = 0) -> int:
    order = Order.objects.create(email=email, amount_cents=1)
    if current_job().attempts <= fail_times:
        raise Unreachable(f"attempt {current_job().attempts}")
    return order.pk


@job(name="tests.testing.async_double")
async def async_double(n: int) -> int:
    await asyncio.sleep(0)
    return 2 * n


@job(name="tests.testing.async_orders")
async def async_orders(email: str) -> int:
    """One write and one query through Django's async ORM: the orders of ``email``'s domain.

    Each test uses a domain of its own, so only its rows count (rows another
    connection leaked, committed outside a test's transaction, do not).
    """
    await Order.objects.acreate(email=email, amount_cents=1)
    return await Order.objects.filter(email__endswith="@" + email.partition("@")[2]).acount()


@job(name="tests.testing.atomic_fails", retries=1, atomic=True)
def atomic_fails() -> None:
    raise Unreachable("always, atomically")


class Finished:
    """The ``job_finished`` signals sent while it is connected: (job id, outcome, reason)."""

    def __init__(self):
        self.heard = []

    def __enter__(self):
        signals.job_finished.connect(self.receive)
        return self.heard

    def __exit__(self, *exc_info):
        signals.job_finished.disconnect(self.receive)

    def receive(self, sender, *, job_id, outcome, dead_letter_reason, **kwargs):
        self.heard.append((job_id, outcome, dead_letter_reason))


def told(runs):
    """What ``run_jobs`` says of each run, in the signal's terms."""
    return [(r.job_id, r.outcome, r.reason) for r in runs]


class OnThisBackend:
    """The suite's ``backend`` fixture, unparametrized: unittest classes take no parameters.

    The pass still runs on one backend (``SONIQ_TEST_BACKEND``), so these
    classes run on both databases, once per pass; their ids just lack it.
    """

    @pytest.fixture(autouse=True)
    def backend(self):
        return settings.BACKEND


class RunJobsInTestCase(OnThisBackend, TestCase):
    """One transaction for the whole test: the jobs run on the test's connection, inside it."""

    def test_runs_a_queued_job_and_records_its_result(self):
        job_id = make_order.enqueue(email="ada@example.com", amount_cents=4200)
        runs = run_jobs()
        assert [(r.job_id, r.job_name, r.outcome, r.status, r.attempt) for r in runs] == [
            (job_id, "tests.testing.order", "done", "done", 1)]
        order = Order.objects.get()
        assert runs[0].result == order.pk and order.email == "ada@example.com"
        info = get_job(job_id)
        assert (info.status, info.result, info.attempts) == ("done", order.pk, 1)
        assert run_jobs() == []

    def test_the_claim_was_a_real_fenced_claim(self):
        job_id = make_order.enqueue(email="x@example.com")
        run_jobs()
        row = Job.objects.get(id=job_id)
        assert row.claim_owner.startswith("soniq_django.testing:")
        assert row.claim_generation == 1 and row.claim_token
        assert row.lease_expires_at is None and row.expires_at is not None

    def test_leases_use_the_clock_not_the_transaction_start(self):
        # The test's transaction started over a lease ago. A lease counted
        # from the transaction's start (now()) would already have lapsed and
        # the completion would be refused as "lease lost".
        with override_settings(SONIQ={"LEASE_SECONDS": 1}):
            Order.objects.count()  # the transaction has begun
            job_id = make_order.enqueue(email="late@example.com")
            time.sleep(1.3)
            runs = run_jobs()
        assert [(r.outcome, r.status) for r in runs] == [("done", "done")]
        assert Job.objects.get(id=job_id).status == "done"

    def test_on_commit_enqueues_run_once_the_callbacks_ran(self):
        with self.captureOnCommitCallbacks(execute=False):
            make_order.enqueue_on_commit(email="never@example.com")
        assert run_jobs() == []  # the test's transaction never commits: no job
        with self.captureOnCommitCallbacks(execute=True):
            job_id = make_order.enqueue_on_commit(email="commit@example.com")
        assert [r.job_id for r in run_jobs()] == [job_id]
        assert Order.objects.get().email == "commit@example.com"

    @override_settings(SONIQ=NO_BACKOFF)
    def test_a_due_retry_runs_in_the_same_call(self):
        job_id = flaky.enqueue(fail_times=2)
        runs = run_jobs(raise_exceptions=False)
        assert [(r.attempt, r.outcome, r.status) for r in runs] == [
            (1, "retry", "queued"), (2, "retry", "queued"), (3, "done", "done")]
        assert "Unreachable: attempt 2" in runs[1].error
        assert get_job(job_id).result == 3

    @override_settings(SONIQ=NO_BACKOFF)
    def test_attempts_run_out_into_the_dead_letters(self):
        job_id = always_fails.enqueue()
        runs = run_jobs(raise_exceptions=False)
        assert [(r.outcome, r.status, r.reason) for r in runs] == [
            ("retry", "queued", None), ("retry", "queued", None),
            ("dead", "dead_letter", "max_retries_exceeded")]
        dead = DeadLetterJob.objects.get(id=job_id)
        assert (dead.dead_letter_reason, dead.attempts) == ("max_retries_exceeded", 3)
        assert get_job(job_id).status == "dead_letter"

    def test_a_retry_waiting_for_its_backoff_is_not_due(self):
        job_id = flaky.enqueue(fail_times=1)  # RETRY_BASE_SECONDS 2 (the default)
        assert [r.outcome for r in run_jobs(raise_exceptions=False)] == ["retry"]
        assert run_jobs() == []
        assert [r.outcome for r in run_jobs(include_scheduled=True)] == ["done"]
        assert get_job(job_id).attempts == 2

    def test_the_handlers_exception_propagates_after_the_failure_is_written(self):
        job_id = flaky.enqueue(fail_times=5)
        with pytest.raises(Unreachable, match="attempt 1"):
            run_jobs()
        row = Job.objects.get(id=job_id)
        assert (row.status, row.attempts, row.lease_expires_at) == ("queued", 1, None)
        assert "Unreachable" in row.last_error

    def test_a_permanent_failure_dead_letters_at_once(self):
        job_id = permanent.enqueue()
        with pytest.raises(PermanentFailure):
            run_jobs()
        assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "permanent_failure"

    def test_a_job_without_a_handler_fails_with_a_code(self):
        job_id = enqueue("tests.testing.nobody_handles_this")
        with pytest.raises(SoniqError) as raised:
            run_jobs()
        assert raised.value.code is ErrorCode.JOB_FAILED
        assert str(job_id) not in str(raised.value)
        assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "job_not_found"

    def test_recorded_failures_say_why(self):
        enqueue("tests.testing.nobody_handles_this")
        (run,) = run_jobs(raise_exceptions=False)
        assert (run.outcome, run.status, run.reason) == ("dead", "dead_letter", "job_not_found")

    def test_a_failed_query_does_not_break_the_tests_transaction(self):
        job_id = bad_query.enqueue()
        (run,) = run_jobs(raise_exceptions=False)
        assert (run.outcome, run.status) == ("retry", "queued")
        assert Job.objects.get(id=job_id).attempts == 1
        # SQLite's transaction survives the failed query, and the handler's
        # write with it; PostgreSQL aborts it, so the handler's savepoint goes.
        kept = Order.objects.filter(email="kept@example.com").exists()
        assert kept is (connection.vendor == "sqlite")

    def test_jobs_a_handler_enqueues_run_in_the_same_call(self):
        chain.enqueue(depth=2)
        runs = run_jobs()
        assert [r.result for r in runs] == [2, 1, 0]

    def test_scheduled_jobs_wait_unless_asked_for(self):
        later = timezone.now() + dt.timedelta(hours=1)
        job_id = make_order.configure(run_at=later).enqueue(email="later@example.com")
        assert run_jobs() == []
        assert run_jobs(now=later - dt.timedelta(minutes=1)) == []
        assert [r.job_id for r in run_jobs(now=later)] == [job_id]

    def test_include_scheduled_runs_every_waiting_job(self):
        later = timezone.now() + dt.timedelta(days=3)
        make_order.configure(run_at=later).enqueue(email="later@example.com")
        assert [r.outcome for r in run_jobs(include_scheduled=True)] == ["done"]

    def test_queues_and_max_jobs_limit_the_run(self):
        make_order.configure(queue="a").enqueue(email="a@example.com")
        make_order.configure(queue="b").enqueue(email="b@example.com")
        make_order.configure(queue="b").enqueue(email="c@example.com")
        assert [r.queue for r in run_jobs(queues=["b"], max_jobs=1)] == ["b"]
        assert [r.queue for r in run_jobs(queues=["a"])] == ["a"]
        assert [r.queue for r in run_jobs()] == ["b"]

    def test_an_async_handler_runs_too(self):
        async_double.enqueue(n=21)
        assert [r.result for r in run_jobs()] == [42]

    def test_an_async_handler_uses_the_tests_connection(self):
        # Its ORM calls run in the test's transaction: they see the test's row,
        # and the test sees theirs (on another connection, SQLite said
        # "database table is locked" and PostgreSQL saw no row at all).
        Order.objects.create(email="before@tc.example", amount_cents=1)
        job_id = async_orders.enqueue(email="async@tc.example")
        assert [(r.job_id, r.outcome, r.result) for r in run_jobs()] == [(job_id, "done", 2)]
        assert Order.objects.filter(email="async@tc.example").exists()

    @override_settings(SONIQ=NO_BACKOFF)
    def test_the_runs_and_the_signals_tell_one_story(self):
        jobs = [always_fails.enqueue(), permanent.enqueue(), flaky.enqueue(fail_times=1),
                atomic_fails.enqueue(), enqueue("tests.testing.nobody_handles_this")]
        with Finished() as heard:
            runs = run_jobs(raise_exceptions=False)
        assert told(runs) == heard
        assert {(r.job_id, r.outcome, r.reason) for r in runs if r.status == "dead_letter"} == {
            (jobs[0], "dead", "max_retries_exceeded"), (jobs[1], "dead", "permanent_failure"),
            (jobs[3], "dead", "max_retries_exceeded"), (jobs[4], "dead", "job_not_found")}

    @override_settings(SONIQ=NO_BACKOFF)
    def test_an_atomic_jobs_failed_runs_leave_none_of_their_writes(self):
        # As in a worker: each failed run's order is rolled back with it (here,
        # to a savepoint inside the test's transaction); the last run's stays.
        job_id = atomic_order.enqueue(email="once@example.com", fail_times=2)
        runs = run_jobs(raise_exceptions=False)
        assert [(r.attempt, r.outcome, r.status) for r in runs] == [
            (1, "retry", "queued"), (2, "retry", "queued"), (3, "done", "done")]
        assert list(Order.objects.values_list("pk", flat=True)) == [runs[-1].result]
        assert Job.objects.get(id=job_id).attempts == 3

    def test_bad_options_are_refused(self):
        for options in ({"max_jobs": 0}, {"max_jobs": True}, {"queues": "default"},
                        {"now": dt.datetime(2030, 1, 1)}, {"raise_exceptions": 1},
                        {"include_scheduled": True, "now": timezone.now()}):
            with pytest.raises(ConfigValidationError):
                run_jobs(**options)


class ImmediateInTestCase(OnThisBackend, TestCase):

    def test_enqueue_runs_the_job_before_it_returns(self):
        with immediate() as runs:
            job_id = make_order.enqueue(email="now@example.com")
            assert Order.objects.filter(email="now@example.com").exists()
        assert [(r.job_id, r.status) for r in runs] == [(job_id, "done")]
        make_order.enqueue(email="queued@example.com")  # outside the block: queued
        assert Job.objects.filter(status="queued").count() == 1

    def test_on_commit_runs_at_the_commit(self):
        with immediate() as runs:
            with self.captureOnCommitCallbacks(execute=True):
                make_order.enqueue_on_commit(email="c@example.com")
                assert runs == [] and not Order.objects.exists()
        assert [r.status for r in runs] == ["done"] and Order.objects.exists()

    def test_a_failure_propagates_from_the_enqueue(self):
        with immediate():
            with pytest.raises(Unreachable):
                flaky.enqueue(fail_times=1)

    @override_settings(SONIQ=NO_BACKOFF)
    def test_or_is_recorded(self):
        with immediate(raise_exceptions=False) as runs:
            job_id = enqueue("tests.testing.fails")  # by name: max_attempts 4
        assert [r.outcome for r in runs] == ["retry"] * 3 + ["dead"]
        assert get_job(job_id).status == "dead_letter"

    def test_nested_enqueues_run_after_their_parent(self):
        with immediate() as runs:
            chain.enqueue(depth=2)
        assert [r.result for r in runs] == [2, 1, 0]

    def test_an_async_handler_runs_on_the_tests_connection(self):
        Order.objects.create(email="before@imm.example", amount_cents=1)
        with immediate() as runs:
            async_orders.enqueue(email="imm-async@imm.example")
        assert [r.result for r in runs] == [2]

    def test_as_a_decorator(self):
        @immediate()
        def place():
            return make_order.enqueue(email="d@example.com")

        assert get_job(place()).status == "done"


class RunJobsInTransactionTestCase(OnThisBackend, TransactionTestCase):
    """Real commits: on-commit enqueues insert after the commit, rollbacks leave nothing."""

    def test_on_commit_enqueues_after_a_real_commit(self):
        with transaction.atomic():
            job_id = make_order.enqueue_on_commit(email="tx@example.com")
            assert not Job.objects.filter(id=job_id).exists()
        assert [r.job_id for r in run_jobs()] == [job_id]
        assert Order.objects.get().email == "tx@example.com"

    def test_a_rolled_back_enqueue_runs_nothing(self):
        with pytest.raises(Unreachable), transaction.atomic():
            make_order.enqueue_on_commit(email="rolled@example.com")
            raise Unreachable
        assert run_jobs() == []

    @override_settings(SONIQ=NO_BACKOFF)
    def test_an_atomic_jobs_writes_commit_with_its_completion_only(self):
        atomic_order.enqueue(email="tx-once@example.com", fail_times=1)
        assert [r.outcome for r in run_jobs(raise_exceptions=False)] == ["retry", "done"]
        assert Order.objects.filter(email="tx-once@example.com").count() == 1

    @override_settings(SONIQ=NO_BACKOFF)
    def test_retries_and_dead_letters_commit(self):
        job_id = always_fails.enqueue()
        assert len(run_jobs(raise_exceptions=False)) == 3
        assert DeadLetterJob.objects.get(id=job_id).attempts == 3

    def test_an_async_handler_commits_on_the_same_database(self):
        Order.objects.create(email="before@tx.example", amount_cents=1)
        async_orders.enqueue(email="tx-async@tx.example")
        assert [r.result for r in run_jobs()] == [2]
        with immediate() as runs:
            async_orders.enqueue(email="tx-async-2@tx.example")
        assert [r.result for r in runs] == [3]
        assert Order.objects.filter(email__endswith="@tx.example").count() == 3

    @override_settings(SONIQ=NO_BACKOFF)
    def test_the_runs_and_the_signals_tell_one_story(self):
        always_fails.enqueue()
        atomic_fails.enqueue()
        with Finished() as heard:
            runs = run_jobs(raise_exceptions=False)
        assert told(runs) == heard
        assert [r.outcome for r in runs if r.status == "dead_letter"] == ["dead", "dead"]

    def test_immediate_runs_after_the_commit(self):
        with immediate() as runs, transaction.atomic():
            make_order.enqueue_on_commit(email="imm@example.com")
            assert runs == []
        assert [r.status for r in runs] == ["done"]


# pytest-django style, with the plugin's fixtures -----------------------------


def test_the_fixture_runs_jobs_with_database_access(soniq_run_jobs):
    job_id = make_order.enqueue(email="fixture@example.com")
    assert [r.job_id for r in soniq_run_jobs()] == [job_id]


def test_the_fixture_with_captured_on_commit_callbacks(soniq_run_jobs,
                                                       django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        job_id = make_order.enqueue_on_commit(email="cb@example.com")
    assert [r.job_id for r in soniq_run_jobs()] == [job_id]


@pytest.mark.django_db(transaction=True)
def test_the_fixture_in_a_transactional_test(soniq_run_jobs, settings):
    settings.SONIQ = NO_BACKOFF
    with transaction.atomic():
        job_id = flaky.enqueue_on_commit(fail_times=1)
    assert [r.outcome for r in soniq_run_jobs(raise_exceptions=False)] == ["retry", "done"]
    assert get_job(job_id).status == "done"


def test_the_immediate_fixture(soniq_immediate):
    job_id = make_order.enqueue(email="imm@example.com")
    assert [r.job_id for r in soniq_immediate] == [job_id]


def test_the_fixtures_run_async_handlers_on_the_tests_connection(soniq_run_jobs):
    Order.objects.create(email="before@fx.example", amount_cents=1)
    async_orders.enqueue(email="fixture-async@fx.example")
    assert [r.result for r in soniq_run_jobs()] == [2]
    with immediate() as runs:
        async_orders.enqueue(email="fixture-async-2@fx.example")
    assert [r.result for r in runs] == [3]


def test_the_immediate_fixture_runs_async_handlers_too(soniq_immediate):
    Order.objects.create(email="before@fximm.example", amount_cents=1)
    async_orders.enqueue(email="imm-async@fximm.example")
    assert [r.result for r in soniq_immediate] == [2]


@pytest.mark.django_db(transaction=True)
def test_the_fixture_runs_async_handlers_in_a_transactional_test(soniq_run_jobs):
    Order.objects.create(email="before@fxtx.example", amount_cents=1)
    async_orders.enqueue(email="tx-fixture-async@fxtx.example")
    assert [r.result for r in soniq_run_jobs()] == [2]


# Async ----------------------------------------------------------------------


@pytest.mark.django_db
def test_arun_jobs_in_an_event_loop():
    async def scenario():
        job_id = await make_order.aenqueue(email="async@example.com")
        with pytest.raises(SoniqError) as raised:
            run_jobs()
        assert raised.value.code is ErrorCode.ASYNC_CONTEXT
        assert "arun_jobs" in raised.value.reason
        return job_id, await arun_jobs()

    # async_to_sync: the loop runs in another thread, and the awaited
    # database work comes back to this one, inside the test's transaction.
    job_id, runs = async_to_sync(scenario)()
    assert [(r.job_id, r.status) for r in runs] == [(job_id, "done")]


# The plugin, loaded as a project loads it, in a session of its own ----------

PLUGGED = '''
from soniq_django import enqueue


def test_first_and_only(soniq_run_jobs):  # no django_db mark: the fixture asks for db
    enqueue("tests.add", {"a": 1, "b": 2})
    assert [run.result for run in soniq_run_jobs()] == [3]
'''


def test_the_plugin_gives_a_fresh_session_its_database(tmp_path):
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.settings import run_database_name

    root = Path(__file__).resolve().parents[1]
    (tmp_path / "test_plugged.py").write_text(PLUGGED, encoding="utf-8")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
         "soniq_django.testing", "--ds", "tests.settings", "--rootdir", str(tmp_path),
         "-c", os.devnull, str(tmp_path / "test_plugged.py")],
        cwd=tmp_path, capture_output=True,
        # A test database of its own (PostgreSQL): the outer session holds its one.
        env={**os.environ, "PYTHONPATH": str(root), "SONIQ_TEST_DATABASE_NAME":
             f"{run_database_name()}_plugin"},
        text=True, timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "1 passed" in result.stdout


@pytest.mark.django_db
def test_immediate_runs_an_async_handler_an_async_enqueue_queued():
    # aenqueue inside an event loop: the run happens in Django's sync thread,
    # and the handler's ORM calls come back to it, inside the test's transaction.
    Order.objects.create(email="before@aimm.example", amount_cents=1)

    async def scenario():
        with immediate() as runs:
            await async_orders.aenqueue(email="aenqueued@aimm.example")
        return runs

    assert [r.result for r in async_to_sync(scenario)()] == [2]
