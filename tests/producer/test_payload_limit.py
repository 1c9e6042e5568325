"""SONIQ["MAX_PAYLOAD_BYTES"]: args larger than the limit are refused, with their size, never echoed.

The size is the args' compact UTF-8 JSON (what soniq sends to PostgreSQL).
Every Python producer refuses before anything is written; the SQL API does
not apply the setting (docs/settings.md#the-payload-limit says why).
"""

import pytest
from django.db import connection
from django.test import override_settings

from soniq_django import abulk_enqueue, aenqueue, bulk_enqueue, enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode, PayloadTooLarge
from soniq_django.models import Job
from soniq_django.owned import JobRequest, OwnedJobSource
from soniq_django.producer.request import encode_args
from tests.testapp.jobs import flexible

pytestmark = pytest.mark.django_db

SECRET = "secret-payload-"


def args_of(size: int, fill: str = "x") -> dict:
    """Args whose compact UTF-8 JSON is exactly ``size`` bytes (``fill``: one character)."""
    overhead = len(encode_args({"data": ""}).encode())
    per = len(fill.encode())
    count, rest = divmod(size - overhead - len(SECRET), per)
    assert rest == 0, "pick a size the fill character divides"
    args = {"data": SECRET + fill * count}
    assert len(encode_args(args).encode()) == size
    return args


def test_a_20_mb_payload_is_refused_by_default_without_echoing_it():
    args = {"document": SECRET + "x" * (20 * 1024 * 1024)}
    with pytest.raises(PayloadTooLarge) as raised:
        enqueue("tests.add", args)
    error = raised.value
    assert isinstance(error, ConfigValidationError)
    assert error.code is ErrorCode.PAYLOAD_TOO_LARGE
    assert (error.size, error.limit, error.index) == (20 * 1024 * 1024 + 30, 1024 * 1024, None)
    assert error.reason == (
        "the job args are 20,971,550 bytes as JSON, more than SONIQ['MAX_PAYLOAD_BYTES'] "
        "(1,048,576); pass ids and let the handler load the data")
    assert SECRET not in str(error)
    assert not Job.objects.exists()


@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": 1000})
def test_the_limit_itself_is_accepted_and_one_byte_more_is_not():
    job_id = enqueue("tests.add", args_of(1000))
    assert Job.objects.get(id=job_id).args == args_of(1000)
    with pytest.raises(PayloadTooLarge) as raised:
        enqueue("tests.add", args_of(1001))
    assert (raised.value.size, raised.value.limit) == (1001, 1000)
    assert Job.objects.count() == 1


@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": 1000})
def test_the_size_counts_utf8_bytes_not_characters():
    # "é" is two bytes of UTF-8: 500-odd characters are over 1000 bytes.
    args = args_of(1002, fill="é")
    assert len(encode_args(args)) < 1000
    with pytest.raises(PayloadTooLarge) as raised:
        enqueue("tests.add", args)
    assert raised.value.size == 1002


@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": 1000})
def test_bulk_enqueue_names_the_request_and_writes_none_of_the_batch():
    requests = [JobRequest("tests.add", {"a": 1}), JobRequest("tests.add", {"a": 2}),
                JobRequest("tests.add", args_of(1001)), JobRequest("tests.add", {"a": 3})]
    for call in (bulk_enqueue, abulk_enqueue):  # abulk_enqueue refuses at the call
        with pytest.raises(PayloadTooLarge) as raised:
            call(requests)
        assert raised.value.index == 2
        assert raised.value.reason.startswith(
            "request 2 (counting from 0): the job args are 1,001 bytes as JSON")
    assert not Job.objects.exists()


CALLS = {
    "handler.enqueue": lambda args: flexible.enqueue(1, **args),
    "handler.enqueue_on_commit": lambda args: flexible.enqueue_on_commit(1, **args),
    "aenqueue": lambda args: aenqueue("tests.add", args),  # refused at the call, not awaited
}


@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": 1000})
@pytest.mark.parametrize("call", list(CALLS))
def test_every_python_producer_applies_the_limit(call):
    with pytest.raises(PayloadTooLarge):
        CALLS[call](args_of(1001))
    assert not Job.objects.exists()


@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": 1000})
def test_submit_owned_refuses_it_with_the_owned_apis_code():
    # The owned API's rule: every invalid request is CONFIG; the reason keeps the code.
    with pytest.raises(ConfigValidationError) as raised:
        OwnedJobSource().submit_owned(JobRequest("tests.add", args_of(1001)),
                                      submission_id="big-one")
    assert raised.value.code is ErrorCode.CONFIG
    assert raised.value.reason.startswith("PAYLOAD_TOO_LARGE: the job args are 1,001 bytes")
    assert not Job.objects.exists()


@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": None})
def test_none_lifts_the_limit():
    args = {"document": "x" * (2 * 1024 * 1024)}
    assert Job.objects.get(id=enqueue("tests.add", args)).args == args


@pytest.mark.postgresql_only
@override_settings(SONIQ={"MAX_PAYLOAD_BYTES": 1000})
def test_the_sql_api_does_not_apply_the_setting():
    # The documented choice: soniq_enqueue takes what PostgreSQL stores.
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_enqueue('tests.add', %s::jsonb)",
                       [encode_args(args_of(5000))])
        (job_id,) = cursor.fetchone()
    assert Job.objects.get(id=job_id).args == args_of(5000)
