"""Item 1: a job's key, computed at enqueue and stored outside format 1's columns.

Every enqueue path (handle.enqueue, enqueue(), bulk_enqueue, enqueue_on_commit,
configure(), the SQL API on PostgreSQL) stores the key in
soniq_jobs.concurrency_key and parks the job; @job's options are checked
with clear errors. Both databases.
"""

import uuid

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connection, transaction
from hypothesis import given, settings as hsettings, strategies as st

from soniq_django import bulk_enqueue, enqueue, job
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.keys.models import KEY_PARKED_AT, KeyParked, KeySlot
from soniq_django.models import Job
from soniq_django.producer.request import JobRequest

pytestmark = pytest.mark.django_db(transaction=True)


@job(name="keys.sync", concurrency_key="tenant", key_concurrency=1, key_rate="5/s")
def sync_tenant(tenant: str, n: int = 0) -> None:
    return None


@job(name="keys.called", concurrency_key=lambda **kw: f"org-{kw['org']}", key_concurrency=2)
def called(org: int) -> None:
    return None


@job(name="keys.defaulted", concurrency_key="region")
def defaulted(region: str = "eu") -> None:
    return None


def keyed_rows():
    return {row.id: row for row in Job.objects.exclude(concurrency_key=None)}


def test_the_key_comes_from_the_named_argument_and_the_job_is_parked_but_the_first_offered():
    first = sync_tenant.enqueue(tenant="acme", n=1)
    second = sync_tenant.enqueue(tenant="acme", n=2)
    rows = keyed_rows()
    assert {r.concurrency_key for r in rows.values()} == {"acme"}
    slot = KeySlot.objects.get(queue="default", key="acme")
    assert (slot.configured_concurrency, slot.configured_rate_limit,
            slot.configured_rate_period) == (1, 5, 1)
    assert slot.head == first and rows[first].scheduled_at is None
    assert rows[second].scheduled_at == KEY_PARKED_AT
    assert list(KeyParked.objects.values_list("job_id", flat=True)) == [second]


def test_a_callable_key_and_an_argument_default():
    a = called.enqueue(org=7)
    b = defaulted.enqueue()
    c = defaulted.enqueue(region="us")
    rows = keyed_rows()
    assert (rows[a].concurrency_key, rows[b].concurrency_key,
            rows[c].concurrency_key) == ("org-7", "eu", "us")


def test_an_integer_argument_is_a_key_in_decimal():
    found = sync_tenant.enqueue(tenant=42)
    assert Job.objects.get(id=found).concurrency_key == "42"


def test_enqueue_bulk_enqueue_and_on_commit_store_the_key():
    one = enqueue("keys.any", {"x": 1}, concurrency_key="k1", key_concurrency=3)
    ids = bulk_enqueue([JobRequest("keys.any", {"n": n}, concurrency_key=f"b{n % 2}",
                                   key_rate="2/m") for n in range(4)]
                       + [JobRequest("keys.plain", {})])
    with transaction.atomic():
        later = sync_tenant.enqueue_on_commit(tenant="t9")
        assert not Job.objects.filter(id=later).exists()
    rows = keyed_rows()
    assert rows[one].concurrency_key == "k1"
    assert [rows[i].concurrency_key for i in ids[:4]] == ["b0", "b1", "b0", "b1"]
    assert ids[4] not in rows
    assert rows[later].concurrency_key == "t9"
    assert KeySlot.objects.get(key="b0").configured_rate_limit == 2
    assert KeySlot.objects.get(key="b0").configured_rate_period == 60


def test_a_unique_keyed_job_returns_the_queued_ones_id():
    first = enqueue("keys.u", {"a": 1}, unique_job=True, concurrency_key="u")
    again = enqueue("keys.u", {"a": 1}, unique_job=True, concurrency_key="u")
    assert first == again
    assert Job.objects.filter(job_name="keys.u").count() == 1


@pytest.mark.parametrize("options, words", [
    ({"key_concurrency": 1}, "need concurrency_key"),
    ({"key_rate": "5/s"}, "need concurrency_key"),
    ({"concurrency_key": "nope"}, "names no argument"),
    ({"concurrency_key": 5}, "an argument name or a callable"),
    ({"concurrency_key": "tenant", "key_concurrency": 0}, "whole number from 1"),
    ({"concurrency_key": "tenant", "key_concurrency": True}, "whole number from 1"),
    ({"concurrency_key": "tenant", "key_rate": "5 per second"}, "key_rate"),
    ({"concurrency_key": "tenant", "key_rate": "0/s"}, "key_rate"),
])
def test_job_options_are_checked_with_clear_errors(options, words):
    with pytest.raises(ImproperlyConfigured) as error:
        @job(name="keys.bad", **options)
        def bad(tenant: str) -> None:
            return None
    assert words in str(error.value)


@pytest.mark.parametrize("kwargs, words", [
    ({"tenant": None}, "must be a string"),
    ({"tenant": ""}, "1 to 255 characters"),
    ({"tenant": "x" * 256}, "1 to 255 characters"),
    ({"tenant": "a\x00b"}, "without NUL"),
    ({"tenant": 1.5}, "must be a string"),
])
def test_a_bad_key_is_refused_before_any_write(kwargs, words):
    with pytest.raises(ConfigValidationError) as error:
        sync_tenant.enqueue(**kwargs)
    assert error.value.code == ErrorCode.INVALID_OPTION
    assert words in str(error.value)
    assert "a\x00b" not in str(error.value)
    assert not Job.objects.exists()


def test_a_callable_that_raises_or_returns_no_string_is_refused():
    @job(name="keys.raises", concurrency_key=lambda **kw: kw["missing"])
    def raises(x: int) -> None:
        return None

    @job(name="keys.number", concurrency_key=lambda **kw: 5)
    def number(x: int) -> None:
        return None

    for handle in (raises, number):
        with pytest.raises(ConfigValidationError) as error:
            handle.enqueue(x=1)
        assert error.value.code == ErrorCode.INVALID_OPTION
    assert not Job.objects.exists()


def test_enqueue_refuses_limits_without_a_key_and_a_bad_rate():
    with pytest.raises(ConfigValidationError) as error:
        enqueue("keys.any", {}, key_concurrency=2)
    assert error.value.code == ErrorCode.INVALID_OPTION
    with pytest.raises(ConfigValidationError):
        enqueue("keys.any", {}, concurrency_key="k", key_rate="fast")


@hsettings(max_examples=60, deadline=None)
@given(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                 st.text(max_size=300), st.lists(st.integers(), max_size=2)))
def test_key_concurrency_accepts_whole_numbers_from_one_only(value):
    ok = type(value) is int and 1 <= value <= 2**31 - 1
    try:
        request = JobRequest("keys.any", {}, concurrency_key="k", key_concurrency=value)
        from soniq_django.producer.request import prepare
        prepared = prepare(request)
    except ConfigValidationError as error:
        assert not ok or value is None
        assert error.code == ErrorCode.INVALID_OPTION
    else:
        assert ok or value is None
        assert prepared.key.concurrency == value


@pytest.mark.postgresql_only
def test_the_sql_api_sets_a_key_and_checks_its_options():
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_enqueue_keyed('t1', 2, '3/m', 'keys.sql', '{}'::jsonb)")
        (found,) = cursor.fetchone()
        row = Job.objects.get(id=found)
        assert row.concurrency_key == "t1" and row.scheduled_at is None  # offered at once
        slot = KeySlot.objects.get(key="t1")
        assert (slot.configured_concurrency, slot.configured_rate_limit,
                slot.configured_rate_period) == (2, 3, 60)
        for args in (("''", "NULL", "NULL"), ("'k'", "0", "NULL"), ("'k'", "NULL", "'3/d'")):
            with pytest.raises(Exception) as error, transaction.atomic():
                cursor.execute(f"SELECT soniq_enqueue_keyed({', '.join(args)}, 'keys.sql')")
            cause = error.value.__cause__
            assert cause.sqlstate == "22023"
            assert cause.diag.message_hint == "SONIQ_INVALID_OPTION"
    assert uuid.UUID(str(found))
