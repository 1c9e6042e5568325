"""Errors about arguments and options name the argument (and a wrong value's type), never the value.

The codes stay what they were (TASK_ARGS_INVALID, INVALID_OPTION,
INVALID_MAX_ATTEMPTS, INVALID_TASK_NAME): callers branch on them; the
reasons are for the person reading them.
"""

import datetime as dt
import decimal

import pytest

from soniq_django import bulk_enqueue, enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.models import Job
from soniq_django.owned import JobRequest
from tests.testapp import tasks
from tests.testapp.jobs import add, flexible, positional_only

pytestmark = pytest.mark.django_db

SECRET = "hunter2-secret-value"


def refused(call, *args, **kwargs) -> ConfigValidationError:
    with pytest.raises(ConfigValidationError) as caught:
        call(*args, **kwargs)
    assert SECRET not in str(caught.value)
    return caught.value


@pytest.mark.parametrize(
    ("handler", "args", "kwargs", "needle"),
    [
        (add, (), {}, "missing a required argument: 'a' (job tests.add)"),
        (add, (), {"a": 1, "c": SECRET}, "got an unexpected keyword argument 'c' (job tests.add)"),
        (add, (1, 2, SECRET), {}, "too many positional arguments (job tests.add)"),
        (add, (1,), {"a": 1}, "multiple values for argument 'a' (job tests.add)"),
        (flexible, ("x", SECRET), {}, "extra positional arguments (*rest) of job tests.flexible"),
        (positional_only, (1,), {"b": 2},
         "argument 'a' of job tests.positional_only is positional-only"),
    ],
)
def test_arguments_that_do_not_fit_the_handler_are_named(handler, args, kwargs, needle):
    error = refused(handler.enqueue, *args, **kwargs)
    assert error.code is ErrorCode.TASK_ARGS_INVALID
    assert needle in error.reason
    error = refused(handler.configure(priority=1).enqueue_on_commit, *args, **kwargs)
    assert needle in error.reason
    assert not Job.objects.exists()


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"when": dt.datetime.now(dt.UTC)}, "argument 'when': a value of type datetime is not"),
        ({"amount": decimal.Decimal("1.5")}, "argument 'amount': a value of type Decimal is not"),
        ({"payload": {"k": [1, {SECRET: {1, 2}}]}},
         "inside argument 'payload': a value of type set is not standard JSON"),
        ({"payload": {b"raw": 1}}, "inside argument 'payload': an object key is of type bytes"),
        ({"ratio": float("nan")}, "argument 'ratio': NaN and Infinity are not JSON"),
        ({"n": 10**400}, "argument 'n': a number too large for a 64-bit float"),
        ({"note": SECRET + "\x00"}, "argument 'note': a string holds a NUL character"),
        ({SECRET: object()}, "an argument whose name is not an identifier: a value of type object"),
        ([SECRET], "args must be a JSON object (a dict of keyword arguments), not list"),
    ],
)
def test_args_that_are_not_json_name_the_argument_and_the_type(args, needle):
    for call in (lambda: enqueue("tests.add", args),
                 lambda: bulk_enqueue([JobRequest("tests.add", args)])):
        error = refused(call)
        assert error.code is ErrorCode.TASK_ARGS_INVALID
        assert needle in error.reason
    assert not Job.objects.exists()


def test_a_handlers_non_json_argument_is_named():
    error = refused(add.enqueue, a=1, b={"nested": {SECRET}})
    assert (error.code, error.reason) == (
        ErrorCode.TASK_ARGS_INVALID,
        "inside argument 'b': a value of type set is not standard JSON")


@pytest.mark.parametrize(
    ("options", "code", "needle"),
    [
        ({"priority": "high"}, ErrorCode.INVALID_OPTION, "priority must be a whole number, not str"),
        ({"priority": True}, ErrorCode.INVALID_OPTION, "priority must be a whole number, not bool"),
        ({"priority": 2**31}, ErrorCode.INVALID_OPTION, "priority must be in the 32-bit"),
        ({"queue": 5}, ErrorCode.INVALID_OPTION, "queue must be a non-empty string of at most 255 "
                                                 "characters, not int"),
        ({"queue": ""}, ErrorCode.INVALID_OPTION, "queue must be a non-empty string of at most 255 "
                                                  "characters, not an empty one"),
        ({"queue": "q" * 300}, ErrorCode.INVALID_OPTION, "not one of 300"),
        ({"dedup_key": 7}, ErrorCode.INVALID_OPTION, "dedup_key must be a non-empty string of at "
                                                     "most 255 characters, not int"),
        ({"producer_id": ["x"]}, ErrorCode.INVALID_OPTION, "characters, not list"),
        ({"run_at": "tomorrow"}, ErrorCode.INVALID_OPTION,
         "run_at must be an aware datetime or a timedelta, not str"),
        ({"unique_job": 1}, ErrorCode.INVALID_OPTION, "unique_job must be True or False, not int"),
        ({"job_id": 12}, ErrorCode.INVALID_OPTION, "job_id must be a UUID (or its text), not int"),
        ({"job_id": SECRET}, ErrorCode.INVALID_OPTION, "job_id must be a UUID, and this text"),
        ({"max_attempts": "3"}, ErrorCode.INVALID_MAX_ATTEMPTS,
         "max_attempts must be a whole number of at least 1 (retries plus one), or None; not str"),
        ({"max_attempts": 0}, ErrorCode.INVALID_MAX_ATTEMPTS, "not below 1"),
    ],
)
def test_bad_options_name_the_option_and_the_type(options, code, needle):
    error = refused(enqueue, "tests.add", {"a": 1}, **options)
    assert error.code is code
    assert needle in error.reason
    error = refused(add.configure(**options).enqueue, a=1)
    assert (error.code, error.reason) == (code, refused(enqueue, "tests.add", **options).reason)
    assert not Job.objects.exists()


def test_a_job_name_of_the_wrong_type_says_its_type():
    error = refused(enqueue, 12, {})
    assert (error.code, error.reason) == (
        ErrorCode.INVALID_TASK_NAME, "the job name must be a non-empty string, not int")


def test_a_django_task_names_the_argument_that_does_not_fit():
    error = refused(tasks.add.enqueue, 1, 2, c=SECRET)
    assert error.code is ErrorCode.TASK_ARGS_INVALID
    assert error.reason == (
        "got an unexpected keyword argument 'c' (task tests.testapp.tasks.add)")
    assert not Job.objects.exists()
