"""The Django Tasks backend: tasks stored as soniq jobs, run by a real soniq worker."""

import datetime as dt
import importlib
import os
import secrets
import sys
import threading
import traceback
import uuid
from importlib.util import find_spec

import django
import pytest
from asgiref.sync import async_to_sync
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from soniq_django import enqueue, get_job
from soniq_django.errors import ErrorCode, JobCancelled, SoniqError
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from soniq_django.registry import get_handler
from soniq_django.tasks_backend import (
    TASKS_API,
    BaseTaskBackend,
    InvalidTaskError,
    SoniqTaskBackend,
    Task,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    find_task,
    soniq_priority,
    task_backends,
    task_enqueued,
)
from soniq_django.worker import Worker
from tests.support.ci import unavailable
from tests.support.owned import rewrite
from tests.testapp import jobs, tasks

try:  # Django 6
    from django.tasks import task
    from django.tasks.exceptions import TaskResultMismatch
except ImportError:  # the django-tasks backport
    from django_tasks import task
    from django_tasks.exceptions import TaskResultMismatch

# scripts/run-tests names the Django each pass is meant to run on ("5.2",
# "6.0"), so a pass whose virtualenv holds another Django fails here.
INTENDED_DJANGO = os.environ.get("SONIQ_TEST_DJANGO")

ADD = "tests.testapp.tasks.add"
FAST_RETRIES = {"RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}


def CamelCase():  # noqa: N802 - the name is the point: it cannot be a job name
    return None


class Holder:
    @staticmethod
    def method():
        return None


def run_worker(timeout: float = 60.0, **options) -> None:
    """Run ``Worker(burst=True).run()`` to its end; fail instead of hanging."""
    worker = Worker(burst=True, **options)
    outcome: dict = {}

    def body():
        try:
            outcome["code"] = worker.run()
        except BaseException as error:  # re-raised below
            outcome["error"] = error
        finally:
            from django.db import connections

            connections.close_all()

    thread = threading.Thread(target=body, name="test-tasks-worker", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.abort()
        thread.join(10)
        raise AssertionError(f"the burst worker did not finish within {timeout} s")
    if "error" in outcome:
        raise outcome["error"]
    assert outcome["code"] == 0


def backend_with(**options) -> SoniqTaskBackend:
    return SoniqTaskBackend("default", {"QUEUES": ["default", "tasks"], "OPTIONS": options})


def claim(queues=None):
    worker_id = str(uuid.uuid4())
    claimed = OwnedJobSource().claim_next_owned(worker_id, claim_token=secrets.token_hex(16),
                                                queues=queues)
    assert claimed is not None
    return worker_id, claimed


def formatted(error: BaseException) -> str:
    try:
        raise error
    except BaseException as raised:
        return "".join(traceback.format_exception(raised))


# Which Tasks API: Django 6's own, or the backport --------------------------


def test_the_pass_runs_on_the_django_it_is_meant_for():
    if INTENDED_DJANGO is None:
        # A developer's plain pytest run has no intended version; under CI=true a pass
        # that forgot to say which Django it meant fails here instead of passing blind.
        unavailable("SONIQ_TEST_DJANGO is not set (scripts/run-tests sets it for every pass)")
    assert "%d.%d" % django.VERSION[:2] == INTENDED_DJANGO


def test_the_backend_uses_djangos_own_tasks_on_django_6_and_the_backport_before():
    expected = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert TASKS_API == expected
    for name, cls in {"Task": Task, "TaskResult": TaskResult, "BaseTaskBackend": BaseTaskBackend,
                      "InvalidTaskError": InvalidTaskError, "the tests' Task": type(tasks.add),
                      "task_backends": type(task_backends),
                      "the immediate backend": type(task_backends["immediate"])}.items():
        assert f"{cls.__module__}.".startswith(f"{expected}."), (name, cls.__module__)
    assert task_enqueued is importlib.import_module(f"{expected}.signals").task_enqueued
    assert issubclass(SoniqTaskBackend, BaseTaskBackend)
    assert isinstance(tasks.add, Task)
    assert settings.TASKS["immediate"]["BACKEND"].startswith(expected + ".")
    if expected == "django_tasks":
        assert find_spec("django.tasks") is None
    # Django 6 names it InvalidTask; the backend exports it under the backport's name.
    assert InvalidTaskError.__name__ == ("InvalidTask" if expected == "django.tasks"
                                         else "InvalidTaskError")


# The backend and validate_task ------------------------------------------


def test_backend_declares_what_it_supports():
    backend = task_backends["default"]
    assert isinstance(backend, SoniqTaskBackend)
    assert backend.supports_defer and backend.supports_priority
    assert backend.supports_get_result and backend.supports_async_task
    assert backend.queues == {"default", "tasks"}
    assert backend.enqueue_on_commit is False


def test_validate_task_accepts_module_level_sync_and_async_tasks():
    backend = task_backends["default"]
    for candidate in (tasks.add, tasks.async_double, tasks.with_context, tasks.echo):
        backend.validate_task(candidate)
    backend.validate_task(tasks.add.using(priority=-100, queue_name="tasks",
                                          run_after=timezone.now()))


def test_validate_task_rejects_a_module_path_that_is_not_a_job_name():
    with pytest.raises(InvalidTaskError) as caught:
        task(CamelCase)
    message = str(caught.value)
    assert "tests.test_tasks_backend.CamelCase" in message
    assert "TASK_NAME_PATTERN" in message and "Rename" in message


def test_validate_task_follows_the_configured_task_name_pattern():
    with override_settings(SONIQ={"TASK_NAME_PATTERN": r"^billing(\.[a-z_]+)+$"}):
        with pytest.raises(InvalidTaskError, match="TASK_NAME_PATTERN"):
            task_backends["default"].validate_task(tasks.add)
    task_backends["default"].validate_task(tasks.add)


def test_validate_task_rejects_methods_queues_priorities_and_naive_run_after():
    backend = task_backends["default"]
    with pytest.raises(InvalidTaskError, match="module level"):
        task(Holder.method)
    with pytest.raises(InvalidTaskError, match="not valid for backend"):
        tasks.add.using(queue_name="elsewhere")
    with pytest.raises(InvalidTaskError, match="priority"):
        tasks.add.using(priority=101)
    with pytest.raises(InvalidTaskError, match="aware"):
        tasks.add.using(run_after=dt.datetime(2030, 1, 1))
    backend.validate_task(tasks.add)


@pytest.mark.parametrize("options, complaint", [
    ({"enqueue_on_commit": "yes"}, "enqueue_on_commit"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"max_attempts": True}, "max_attempts"),
    ({"database": "nowhere"}, "database"),
    ({"atomic": "yes"}, "atomic"),
    ({"timeout": 0}, r"\['timeout'\] must be a positive, finite number of seconds"),
    ({"timeout": -2}, "timeout"),
    ({"timeout": True}, "timeout"),
    ({"timeout": "60"}, "timeout"),
    ({"timeout": float("inf")}, "timeout"),
    ({"retries": 3}, "unknown keys: retries"),
    ({"key_concurrency": 1}, r"\['key_concurrency'\] and \['key_rate'\] need"),
    ({"concurrency_key": "a", "key_concurrency": 0}, "key_concurrency"),
    ({"concurrency_key": "a", "key_rate": "fast"}, "key_rate"),
    ({"concurrency_key": lambda **kw: "k"}, "concurrency_key"),
])
def test_bad_options_are_refused(options, complaint):
    with pytest.raises(ImproperlyConfigured, match=complaint):
        backend_with(**options)


# Enqueue ----------------------------------------------------------------

needs_db = pytest.mark.django_db


@needs_db
def test_enqueue_stores_args_and_kwargs_as_one_object():
    result = tasks.add.enqueue(1, 2, scale=3)
    row = Job.objects.get(id=result.id)
    assert row.job_name == ADD
    assert row.args == {"args": [1, 2], "kwargs": {"scale": 3}}
    assert (row.status, row.queue, row.priority, row.max_attempts, row.scheduled_at) == (
        "queued", "default", 100, 4, None)
    assert result.id == str(row.id)
    assert (result.status, result.args, result.kwargs, result.backend) == (
        TaskResultStatus.READY, [1, 2], {"scale": 3}, "default")
    assert result.task is tasks.add and result.enqueued_at is not None


@pytest.mark.django_db(transaction=True)
def test_task_enqueued_is_sent_once_the_row_is_written():
    seen = []

    def receiver(sender, task_result, **kwargs):
        seen.append((sender, task_result.id, Job.objects.filter(id=task_result.id).exists(),
                     task_result.enqueued_at is not None))

    task_enqueued.connect(receiver)
    try:
        now = tasks.add.enqueue(1, 2)
        assert seen == [(SoniqTaskBackend, now.id, True, True)]
        backend = backend_with(enqueue_on_commit=True)
        with transaction.atomic():
            later = backend.enqueue(tasks.add, (3, 4), {})
            assert len(seen) == 1
        assert seen[1:] == [(SoniqTaskBackend, later.id, True, True)]
    finally:
        task_enqueued.disconnect(receiver)


@needs_db
def test_a_call_without_arguments_stores_empty_args_and_kwargs():
    result = tasks.echo.enqueue()
    assert Job.objects.get(id=result.id).args == {"args": [], "kwargs": {}}


@needs_db
@pytest.mark.parametrize("django_priority, stored", [(0, 100), (100, 0), (-100, 200), (40, 60)])
def test_priority_maps_higher_first_onto_lower_first(django_priority, stored):
    assert soniq_priority(django_priority) == stored
    result = tasks.add.using(priority=django_priority).enqueue(1, 2)
    assert Job.objects.get(id=result.id).priority == stored


@needs_db
def test_queue_and_run_after_map_to_queue_and_scheduled_at():
    when = timezone.now() + dt.timedelta(hours=2)
    result = tasks.echo.using(run_after=when).enqueue("x")
    row = Job.objects.get(id=result.id)
    assert (row.queue, row.priority, row.scheduled_at) == ("tasks", 60, when)


@needs_db
def test_higher_django_priority_is_claimed_first():
    low = tasks.add.using(priority=-50).enqueue(1, 1)
    high = tasks.add.using(priority=50).enqueue(2, 2)
    middle = tasks.add.enqueue(3, 3)
    order = [str(claim()[1].job_id) for _ in range(3)]
    assert order == [high.id, middle.id, low.id]


@needs_db
def test_arguments_that_do_not_fit_or_are_not_json_write_nothing():
    with pytest.raises(SoniqError) as caught:
        tasks.add.enqueue(1)
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    with pytest.raises(SoniqError) as caught:
        tasks.add.enqueue(1, 2, colour="red")
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    with pytest.raises(SoniqError) as caught:
        tasks.echo.enqueue(timezone.now())
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    assert not Job.objects.exists()


@needs_db
def test_max_attempts_option_is_stored_on_the_row():
    result = backend_with(max_attempts=2).enqueue(tasks.add, (1, 2), {})
    assert Job.objects.get(id=result.id).max_attempts == 2


@needs_db
def test_key_options_limit_the_tasks_of_the_backend_per_key():
    backend = backend_with(concurrency_key="a", key_concurrency=1, key_rate="5/s")
    first = backend.enqueue(tasks.add, (1, 2), {})  # the key from a positional argument
    second = backend.enqueue(tasks.add, (), {"a": 1, "b": 3})  # from a keyword
    other = backend.enqueue(tasks.add, (2, 2), {})
    rows = {row.id: row for row in Job.objects.all()}
    assert {rows[uuid.UUID(r.id)].concurrency_key for r in (first, second, other)} == {"1", "2"}
    from soniq_django.keys.models import KeySlot

    slot = KeySlot.objects.get(key="1")
    assert (slot.configured_concurrency, slot.configured_rate_limit) == (1, 5)
    claimed = {claim()[1].job_id, claim()[1].job_id}
    assert claimed == {uuid.UUID(first.id), uuid.UUID(other.id)}  # key "1" runs one at a time
    assert OwnedJobSource().claim_next_owned("w", claim_token=secrets.token_hex(16)) is None


@needs_db
def test_a_task_without_the_key_argument_is_refused_and_writes_nothing():
    from soniq_django.errors import ConfigValidationError

    backend = backend_with(concurrency_key="tenant")
    with pytest.raises(ConfigValidationError) as error:
        backend.enqueue(tasks.add, (1, 2), {})
    assert error.value.code == ErrorCode.INVALID_OPTION
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_default_enqueue_is_part_of_the_callers_transaction():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            result = tasks.add.enqueue(1, 2)
            assert Job.objects.filter(id=result.id).exists()
            raise RuntimeError("roll back")
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_inserts_when_the_transaction_commits():
    backend = backend_with(enqueue_on_commit=True)
    with transaction.atomic():
        result = backend.enqueue(tasks.add, (1, 2), {"scale": 2})
        assert not Job.objects.exists()
        assert result.enqueued_at is None and result.status == TaskResultStatus.READY
    row = Job.objects.get()
    assert str(row.id) == result.id
    assert row.args == {"args": [1, 2], "kwargs": {"scale": 2}}
    assert result.enqueued_at is not None


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_inserts_nothing_on_rollback():
    backend = backend_with(enqueue_on_commit=True)
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            backend.enqueue(tasks.add, (1, 2), {})
            raise RuntimeError("roll back")
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_outside_a_transaction_inserts_at_once():
    result = backend_with(enqueue_on_commit=True).enqueue(tasks.add, (1, 2), {})
    assert Job.objects.filter(id=result.id).exists()


@pytest.mark.django_db(transaction=True)
def test_aenqueue_and_aget_result():
    async def scenario():
        result = await tasks.add.aenqueue(4, 5)
        fetched = await tasks.add.aget_result(result.id)
        return result, fetched

    result, fetched = async_to_sync(scenario)()
    assert Job.objects.get(id=result.id).args == {"args": [4, 5], "kwargs": {}}
    assert (fetched.id, fetched.status, fetched.args) == (result.id, TaskResultStatus.READY,
                                                          [4, 5])


# get_result for each status -----------------------------------------------


@needs_db
def test_a_queued_task_is_ready():
    result = tasks.echo.enqueue(1, key="v")
    fetched = task_backends["default"].get_result(result.id)
    assert fetched.status == TaskResultStatus.READY
    assert (fetched.args, fetched.kwargs, fetched.attempts, fetched.errors) == (
        [1], {"key": "v"}, 0, [])
    assert fetched.task.func is tasks.echo.func
    assert (fetched.task.queue_name, fetched.task.priority) == ("tasks", 40)
    assert fetched.enqueued_at is not None and fetched.finished_at is None
    assert not fetched.is_finished
    with pytest.raises(ValueError):
        fetched.return_value


@needs_db
def test_a_claimed_task_is_running_with_its_worker():
    result = tasks.add.enqueue(1, 2)
    worker_id, _ = claim()
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.RUNNING
    assert fetched.worker_ids == [worker_id] and fetched.attempts == 1


@needs_db
def test_a_done_task_is_successful_with_its_return_value():
    result = tasks.add.enqueue(1, 2)
    _, claimed = claim()
    assert OwnedJobSource().complete_owned(claimed.claim_fence, {"sum": 3})
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == {"sum": 3}
    assert result.finished_at is not None and result.is_finished


@needs_db
def test_a_retried_task_is_ready_again_and_shows_the_error():
    result = tasks.add.enqueue(1, 2)
    _, claimed = claim()
    text = formatted(tasks.TaskBoom("first try"))
    assert OwnedJobSource().fail_owned(claimed.claim_fence, text, retry=True)
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.READY and fetched.attempts == 1
    assert [error.exception_class for error in fetched.errors] == [tasks.TaskBoom]


@needs_db
def test_a_dead_lettered_task_failed_with_the_error():
    result = tasks.add.enqueue(1, 2)
    _, claimed = claim()
    text = formatted(ValueError("line one\nline two"))
    assert OwnedJobSource().fail_owned(claimed.claim_fence, text, retry=False)
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert [error.exception_class_path for error in fetched.errors] == ["builtins.ValueError"]
    assert fetched.errors[0].exception_class is ValueError
    assert fetched.errors[0].traceback == text
    assert fetched.args == [1, 2] and fetched.finished_at is not None
    with pytest.raises(ValueError, match="failed"):
        fetched.return_value


@needs_db
def test_a_cancelled_task_failed_with_a_cancel_error():
    result = tasks.add.enqueue(1, 2)
    assert OwnedJobSource().request_cancel(result.id)
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == TaskResultStatus.FAILED
    assert [error.exception_class for error in fetched.errors] == [JobCancelled]


@needs_db
def test_unknown_malformed_expired_or_foreign_ids_do_not_exist():
    backend = task_backends["default"]
    for missing in (str(uuid.uuid4()), "not-a-uuid"):
        with pytest.raises(TaskResultDoesNotExist):
            backend.get_result(missing)
    result = tasks.add.enqueue(1, 2)
    _, claimed = claim()
    assert OwnedJobSource().complete_owned(claimed.claim_fence, 3)
    assert backend.get_result(result.id).return_value == 3
    rewrite(uuid.UUID(result.id), expires_at=timezone.now() - dt.timedelta(seconds=1))
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(result.id)
    plain_job = jobs.add.enqueue(a=1, b=2)  # a @job job, not a Django task
    with pytest.raises(TaskResultDoesNotExist):
        backend.get_result(str(plain_job))


@needs_db
def test_task_get_result_refuses_another_tasks_result():
    result = tasks.add.enqueue(1, 2)
    with pytest.raises(TaskResultMismatch):
        tasks.echo.get_result(result.id)


# The worker runs the tasks --------------------------------------------------


@pytest.mark.django_db(transaction=True)
@override_settings(SONIQ=FAST_RETRIES)
def test_a_real_worker_runs_sync_async_and_context_tasks():
    added = tasks.add.enqueue(2, 3, scale=10)
    echoed = tasks.echo.enqueue("a", 1, flag=True)
    doubled = tasks.async_double.enqueue(21)
    contextual = tasks.with_context.enqueue("ctx")
    async_contextual = tasks.async_with_context.enqueue("actx")

    run_worker()

    for result in (added, echoed, doubled, contextual, async_contextual):
        result.refresh()
        assert result.status == TaskResultStatus.SUCCESSFUL, result.errors
        assert result.attempts == 1 and result.worker_ids[0]
    assert added.return_value == 50
    assert echoed.return_value == {"args": ["a", 1], "kwargs": {"flag": True}}
    assert doubled.return_value == 42
    assert contextual.return_value == {
        "label": "ctx", "id": contextual.id, "attempt": 1, "status": "RUNNING", "args": ["ctx"],
    }
    assert async_contextual.return_value == {"label": "actx", "id": async_contextual.id,
                                             "attempt": 1}


@pytest.mark.django_db(transaction=True)
@override_settings(SONIQ=FAST_RETRIES)
def test_a_task_that_raises_fails_after_its_retries():
    result = tasks.explode.enqueue("kaboom")
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.FAILED
    assert result.attempts == 4
    [error] = result.errors
    assert error.exception_class_path == "tests.testapp.tasks.TaskBoom"
    assert error.exception_class is tasks.TaskBoom
    assert "kaboom" in error.traceback and "Traceback (most recent call last)" in error.traceback
    dead = DeadLetterJob.objects.get(id=result.id)
    assert (dead.dead_letter_reason, dead.attempts) == ("max_retries_exceeded", 4)


@pytest.mark.django_db(transaction=True)
@override_settings(SONIQ=FAST_RETRIES)
def test_a_retried_task_sees_its_attempt_and_keeps_the_earlier_error():
    result = tasks.flaky.enqueue()
    run_worker()
    result.refresh()
    assert result.status == TaskResultStatus.SUCCESSFUL
    assert result.return_value == 2 and result.attempts == 2
    assert result.worker_ids[0] == "" and result.worker_ids[1]
    [error] = result.errors
    assert error.exception_class is tasks.TaskBoom and "attempt 1" in error.traceback


@pytest.mark.django_db(transaction=True)
@override_settings(SONIQ=FAST_RETRIES)
def test_other_languages_can_enqueue_a_task_with_the_documented_shape():
    ok = enqueue(ADD, {"args": [1], "kwargs": {"b": 2, "scale": 3}})
    kwargs_only = enqueue(ADD, {"kwargs": {"a": 1, "b": 1}})
    flat = enqueue(ADD, {"a": 1, "b": 2})
    extra = enqueue(ADD, {"args": [1, 2], "kwargs": {}, "other": 1})
    misfit = enqueue(ADD, {"args": [1, 2, 3]})
    run_worker()
    backend = task_backends["default"]
    assert backend.get_result(str(ok)).return_value == 9
    assert backend.get_result(str(kwargs_only)).return_value == 2
    for job_id in (flat, extra, misfit):
        assert get_job(job_id).dead_letter_reason == "invalid_arguments"
        assert backend.get_result(str(job_id)).status == TaskResultStatus.FAILED


@pytest.mark.django_db(transaction=True)
@override_settings(SONIQ={**FAST_RETRIES, "UNKNOWN_JOB_GRACE_SECONDS": 0})  # no deferral
def test_a_row_cannot_make_the_worker_call_what_is_not_a_soniq_task(tmp_path):
    marker = tmp_path / "ran"
    names = [
        "tests.testapp.tasks.not_a_task",  # a plain function
        "tests.testapp.tasks.add_alias",  # a Task, but not at its own module path
        "tests.testapp.tasks.immediate_only",  # a Task of another backend
        "tests.testapp.tasks.taskboom",  # nothing there
        "os.system",  # a loaded module, not a Task
    ]
    ids = [enqueue(name, {"args": [str(marker)], "kwargs": {}}) for name in names]
    run_worker()
    assert not marker.exists()
    for job_id in ids:
        assert get_job(job_id).dead_letter_reason == "job_not_found"


def test_get_handler_returns_only_soniq_tasks():
    handler = get_handler(ADD)
    assert (handler.name, handler.queue, handler.is_async, handler.max_attempts) == (
        ADD, "default", False, 4)
    assert handler.func(args=[1, 2], kwargs={"scale": 2}) == 6
    assert handler.signature.bind(args=[1, 2]).arguments == {"a": 1, "b": 2}
    with pytest.raises(TypeError):
        handler.signature.bind(a=1, b=2)
    assert get_handler("tests.testapp.tasks.async_double").is_async
    assert get_handler("tests.add") is jobs.add  # a @job handler is found first
    for name in ("tests.testapp.tasks.not_a_task", "tests.testapp.tasks.add_alias",
                 "tests.testapp.tasks.immediate_only", "os.system", "tests.testapp.tasks",
                 "nodots"):
        assert get_handler(name) is None, name
    assert isinstance(find_task(ADD), Task)


def test_the_resolver_does_not_import_modules_outside_installed_apps(tmp_path, monkeypatch):
    marker = tmp_path / "imported"
    (tmp_path / "soniq_probe_module.py").write_text(
        f"open({str(marker)!r}, 'w').write('imported')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert get_handler("soniq_probe_module.anything") is None
    assert "soniq_probe_module" not in sys.modules
    assert not marker.exists()


def test_the_timeout_option_is_every_task_of_the_backends_limit():
    # The Tasks API has no per-task timeout: the backend's OPTIONS["timeout"]
    # is each of its tasks' @job(timeout=...); tests/worker/test_timeouts.py runs one.
    assert backend_with(timeout=2.5).timeout == 2.5
    assert backend_with().timeout is None
    sleepy = get_handler("tests.testapp.tasks.sleepy")
    assert (sleepy.timeout, sleepy.timeout_origin) == (
        1, "TASKS['timeouts']['OPTIONS']['timeout']")
    assert get_handler(ADD).timeout is None  # the default backend's: JOB_TIMEOUT_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_backend_with_the_atomic_option_runs_its_tasks_atomically(settings):
    from tests.testapp.models import Effect

    settings.SONIQ = FAST_RETRIES
    assert get_handler("tests.testapp.tasks.atomic_effect").atomic is True
    assert get_handler(ADD).atomic is False  # the default backend's
    result = tasks.atomic_effect.enqueue("tasked")
    run_worker()
    done = tasks.atomic_effect.get_result(result.id)
    assert (done.status, done.return_value, done.attempts) == (
        TaskResultStatus.SUCCESSFUL, 2, 2)
    # The first attempt's row was rolled back with it.
    assert list(Effect.objects.filter(job_id=result.id).values_list("generation", "note")) == [
        (2, "tasked")]
