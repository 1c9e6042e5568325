"""The @job decorator, its handles and the registry."""

import datetime as dt
import warnings

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone

from soniq_django import job
from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.models import Job
from soniq_django.registry import JobHandler, get_handler
from tests.testapp.jobs import add, flexible, positional_only, unique_report


def test_autodiscovery_registered_the_apps_handlers():
    assert get_handler("tests.add") is add
    assert get_handler("shop.send_receipt") is not None


def test_handler_is_still_a_plain_callable():
    assert isinstance(add, JobHandler)
    assert add(2, b=3) == 5
    assert add.__name__ == "add" and add.name == "tests.add"


def test_job_works_bare_called_and_named():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)

        @job
        def bare():
            pass

        @job()
        def called():
            pass

    @job(name="tests.named")
    def named():
        pass

    assert bare.name == f"{__name__}.bare"
    assert called.name == f"{__name__}.called"
    assert named.name == "tests.named"


def test_derived_name_warns_with_the_name_pointing_at_the_caller():
    for decorator in (job, job()):
        with pytest.warns(DeprecationWarning) as record:

            def derived_example():
                pass

            decorator(derived_example)
        message = str(record[0].message)
        assert f"{__name__}.derived_example" in message
        assert "name=" in message
        assert record[0].filename == __file__


def test_same_name_for_a_different_function_is_refused():
    with pytest.raises(ImproperlyConfigured):

        @job(name="tests.add")
        def impostor(a, b):
            pass


def test_negative_retries_are_refused():
    with pytest.raises(ImproperlyConfigured):
        job(name="tests.bad_retries", retries=-1)


def test_atomic_is_the_handlers_and_must_be_a_boolean():
    from tests.testapp.jobs import atomic_async_effect, atomic_effect

    assert (atomic_effect.atomic, atomic_async_effect.atomic, add.atomic) == (True, True, False)
    with pytest.raises(ImproperlyConfigured, match="atomic"):
        job(name="tests.bad_atomic", atomic=1)
    # How the worker runs a handler is not an option of one enqueue: a job
    # row has nowhere to carry it.
    with pytest.raises(TypeError, match="@job\\(atomic=True\\)"):
        add.configure(atomic=True)


def test_timeout_is_the_handlers_and_must_be_a_positive_number_of_seconds():
    from tests.testapp.jobs import timeouts_long, timeouts_short

    assert (timeouts_short.timeout, timeouts_long.timeout, add.timeout) == (1, 5, None)
    assert job(name="tests.fractional_timeout", timeout=2.5)(lambda: None).timeout == 2.5
    for bad in (0, -1, 0.0, float("nan"), float("inf"), True, "5", [5]):
        with pytest.raises(ImproperlyConfigured, match=r"@job\(timeout=\.\.\.\) must be a "
                                                       r"positive, finite number of seconds"):
            job(name="tests.bad_timeout", timeout=bad)
    with pytest.raises(ImproperlyConfigured, match="got a value of type str"):
        job(name="tests.bad_timeout", timeout="5")
    with pytest.raises(TypeError, match=r"@job\(timeout=seconds\)"):
        add.configure(timeout=3)


@pytest.mark.django_db
def test_enqueue_stores_bound_keyword_arguments_and_handler_options():
    job_id = add.enqueue(1, b=2)
    row = Job.objects.get(id=job_id)
    assert (row.job_name, row.args, row.queue, row.max_attempts) == (
        "tests.add", {"a": 1, "b": 2}, "default", 4,
    )
    report = Job.objects.get(id=unique_report.enqueue(day="mon"))
    assert (report.queue, report.max_attempts, report.unique_job) == ("reports", 3, True)
    assert report.args_hash is not None
    assert unique_report.enqueue(day="mon") == report.id


@pytest.mark.django_db
def test_omitted_defaults_are_not_stored():
    assert Job.objects.get(id=add.enqueue(a=1)).args == {"a": 1}


@pytest.mark.django_db
def test_var_keyword_arguments_are_flattened():
    row = Job.objects.get(id=flexible.enqueue("x", colour="red"))
    assert row.args == {"first": "x", "colour": "red"}


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("handler", "args", "kwargs"),
    [
        (add, (), {}),
        (add, (1, 2, 3), {}),
        (add, (), {"a": 1, "c": 3}),
        (flexible, ("x", "extra positional"), {}),
        (positional_only, (1,), {"b": 2}),
    ],
)
def test_arguments_that_do_not_bind_raise_before_any_write(handler, args, kwargs):
    with pytest.raises(SoniqError) as caught:
        handler.enqueue(*args, **kwargs)
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_non_json_arguments_are_refused():
    with pytest.raises(SoniqError) as caught:
        add.enqueue(a=dt.datetime.now(dt.UTC))
    assert caught.value.code is ErrorCode.TASK_ARGS_INVALID


@pytest.mark.django_db
def test_configure_sets_per_call_options_without_changing_the_handler():
    run_at = timezone.now() + dt.timedelta(minutes=10)
    job_id = add.configure(run_at=run_at, priority=10, dedup_key="add-1").enqueue(a=1)
    row = Job.objects.get(id=job_id)
    assert (row.scheduled_at, row.priority, row.dedup_key) == (run_at, 10, "add-1")
    chained = add.configure(queue="fast").configure(max_attempts=None).enqueue(a=2)
    assert Job.objects.filter(id=chained, queue="fast", max_attempts__isnull=True).exists()
    plain = Job.objects.get(id=add.enqueue(a=3))
    assert (plain.priority, plain.dedup_key, plain.queue) == (100, None, "default")


def test_configure_rejects_unknown_options():
    with pytest.raises(TypeError):
        add.configure(colour="red")


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_inserts_at_commit_with_the_returned_id():
    with transaction.atomic():
        job_id = add.enqueue_on_commit(a=1)
        assert not Job.objects.filter(id=job_id).exists()
    assert Job.objects.get(id=job_id).args == {"a": 1}


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_rollback_inserts_nothing():
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            add.enqueue_on_commit(a=1)
            raise RuntimeError
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_validates_at_call_time():
    with transaction.atomic():
        with pytest.raises(SoniqError):
            add.enqueue_on_commit(a=float("nan"))
        with pytest.raises(SoniqError):
            add.enqueue_on_commit(z=1)
    assert not Job.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_enqueue_on_commit_outside_a_transaction_inserts_at_once():
    job_id = add.enqueue_on_commit(a=5)
    assert Job.objects.filter(id=job_id).exists()
