"""Gap 2 of issue 31: a keyed job may depend on others (depends_on).

It waits for its dependencies unparked (a waiting job is never its key's
head), then takes its key's place -- parked, or offered when the key has
room -- in the transaction of the write that ended its last dependency; a
dependency that fails cancels it and its key's counts stay right. On both
databases (soniq_settle_dependents_v2 on PostgreSQL, the trigger
soniq_key_released on SQLite), through enqueue, bulk_enqueue and the owned
claim protocol.
"""

import uuid

import pytest
from django.db import transaction

from soniq_django import JobRequest, bulk_enqueue, enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode
from soniq_django.keys.models import KEY_PARKED_AT, KeyParked, KeySlot
from soniq_django.models import WAITING_SCHEDULED_AT, Job, JobWait
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db


def claim(source, n=10):
    return {c.job_id: c for c in
            source.claim_many_owned("w-1", claim_tokens=[nonce() for _ in range(n)])}


def consistent(key="acme"):
    """The key's count is its processing rows; at most one offered job; the parked ones
    are in soniq_key_parked; a waiting keyed job in neither. Returns the count."""
    row = KeySlot.objects.get(key=key)
    assert row.running == Job.objects.filter(concurrency_key=key, status="processing").count()
    queued = Job.objects.filter(concurrency_key=key, status="queued")
    waiting = set(JobWait.objects.filter(job_id__in=queued.values("id"))
                  .values_list("job_id", flat=True))
    offered = queued.exclude(scheduled_at=KEY_PARKED_AT)
    assert offered.count() == (row.head is not None)
    assert row.head not in waiting
    parked = set(queued.filter(scheduled_at=KEY_PARKED_AT).values_list("id", flat=True))
    assert set(KeyParked.objects.filter(key=key).values_list("job_id", flat=True)) == (
        parked - waiting)
    return row.running


def keyed(n=0, depends_on=None, limit=1, key="acme", **options):
    return enqueue("keys.job", {"n": n}, concurrency_key=key, key_concurrency=limit,
                   depends_on=depends_on, **options)


def test_a_keyed_dependent_waits_then_takes_its_keys_place(source):
    first = enqueue("plain.job", {})
    dependent = keyed(depends_on=[first])
    row = Job.objects.get(id=dependent)
    assert (row.concurrency_key, row.scheduled_at) == ("acme", WAITING_SCHEDULED_AT)
    assert JobWait.objects.filter(job_id=dependent).exists()
    assert KeySlot.objects.get(key="acme").configured_concurrency == 1
    got = claim(source)
    assert set(got) == {first} and consistent() == 0
    assert source.complete_owned(got[first].claim_fence) is True
    # Released: its key had room, so it is offered at once.
    assert KeySlot.objects.get(key="acme").head == dependent and consistent() == 0
    got = claim(source)
    assert set(got) == {dependent} and consistent() == 1


def test_a_released_keyed_dependent_is_parked_while_its_key_is_at_its_limit(source):
    first = enqueue("plain.job", {})
    running = keyed(1)
    dependent = keyed(2, depends_on=[first])
    got = claim(source)
    assert set(got) == {first, running} and consistent() == 1
    assert source.complete_owned(got[first].claim_fence) is True
    row = Job.objects.get(id=dependent)
    assert row.scheduled_at == KEY_PARKED_AT
    assert KeyParked.objects.filter(job_id=dependent).exists()
    assert claim(source) == {} and consistent() == 1  # the limit holds
    assert source.complete_owned(got[running].claim_fence) is True
    assert KeySlot.objects.get(key="acme").head == dependent
    assert set(claim(source)) == {dependent} and consistent() == 1


def test_a_waiting_keyed_job_never_blocks_its_key(source):
    first = enqueue("plain.job", {})
    waiting = keyed(1, depends_on=[first])
    free = keyed(2)
    got = claim(source)
    assert set(got) == {first, free} and consistent() == 1
    assert Job.objects.get(id=waiting).scheduled_at == WAITING_SCHEDULED_AT


def test_a_failed_dependency_cancels_the_keyed_dependent_and_its_counts_stay_right(source):
    first = enqueue("plain.job", {}, max_attempts=1)
    dependent = keyed(1, depends_on=[first])
    other = keyed(2)
    got = claim(source)
    assert set(got) == {first, other} and consistent() == 1
    assert source.fail_owned(got[first].claim_fence, "bad", retry=False) is True
    row = Job.objects.get(id=dependent)
    assert row.status == "cancelled" and row.last_error == f"dependency_failed:{first}"
    assert consistent() == 1 and not KeyParked.objects.filter(job_id=dependent).exists()
    assert source.complete_owned(got[other].claim_fence) is True
    assert consistent() == 0 and KeySlot.objects.get(key="acme").head is None


def test_a_keyed_dependent_of_a_keyed_job_of_its_own_key(source):
    first = keyed(1)
    second = keyed(2, depends_on=[first])
    got = claim(source)
    assert set(got) == {first} and consistent() == 1
    assert source.complete_owned(got[first].claim_fence) is True
    assert set(claim(source)) == {second} and consistent() == 1


def test_a_keyed_dependent_whose_dependencies_are_done_is_parked_at_once(source):
    first = enqueue("plain.job", {})
    got = claim(source)
    assert source.complete_owned(got[first].claim_fence) is True
    running = keyed(1)
    claim(source)
    dependent = keyed(2, depends_on=[first])
    assert not JobWait.objects.filter(job_id=dependent).exists()
    assert KeyParked.objects.filter(job_id=dependent).exists()
    assert claim(source) == {} and consistent() == 1
    assert running is not None


def test_a_more_urgent_released_dependent_takes_the_offered_place(source):
    first = enqueue("plain.job", {})
    blocker = keyed(0)
    held = claim(source)
    assert set(held) == {first, blocker}
    urgent = keyed(1, depends_on=[first], priority=1)
    later = keyed(2)  # parked: the key is at its limit
    assert source.complete_owned(held[blocker].claim_fence) is True
    assert KeySlot.objects.get(key="acme").head == later
    assert source.complete_owned(held[first].claim_fence) is True  # releases the urgent one
    assert KeySlot.objects.get(key="acme").head == urgent and consistent() == 0
    assert set(claim(source, n=1)) == {urgent}


def test_bulk_enqueue_of_keyed_dependents_in_order(source):
    first = uuid.uuid4()
    ids = bulk_enqueue([
        JobRequest("plain.job", {}, job_id=first),
        JobRequest("keys.job", {"n": 1}, depends_on=[first], concurrency_key="acme",
                   key_concurrency=1),
        JobRequest("keys.job", {"n": 2}, depends_on=[first], concurrency_key="acme",
                   key_concurrency=1),
        JobRequest("plain.job", {"n": 3}, depends_on=[first]),
    ])
    assert ids[0] == first
    got = claim(source)
    assert set(got) == {first}
    assert source.complete_owned(got[first].claim_fence) is True
    got = claim(source)
    # One of the key's two (equal priority and age: either), and the plain one.
    assert ids[3] in got and len(got) == 2 and consistent() == 1
    (offered,) = set(got) - {ids[3]}
    assert offered in (ids[1], ids[2])
    assert source.complete_owned(got[offered].claim_fence) is True
    assert set(claim(source)) == {ids[1], ids[2]} - {offered}


def test_a_unique_keyed_dependent_finds_its_twin():
    first = enqueue("plain.job", {})
    one = keyed(1, depends_on=[first], unique_job=True)
    assert keyed(1, depends_on=[first], unique_job=True) == one
    assert Job.objects.filter(concurrency_key="acme").count() == 1


def test_an_unknown_dependency_is_refused_and_nothing_is_written():
    with pytest.raises(ConfigValidationError) as error, transaction.atomic():
        keyed(1, depends_on=[uuid.uuid4()])
    assert error.value.code == ErrorCode.UNKNOWN_DEPENDENCY
    assert not Job.objects.exists() and not KeySlot.objects.exists()


@pytest.mark.postgresql_only
def test_the_sql_function_checks_the_key_and_waits_like_soniq_enqueue_after(source):
    from django.db import DatabaseError, connection

    first = enqueue("plain.job", {})
    with connection.cursor() as cursor:
        cursor.execute("SELECT soniq_enqueue_keyed_after('tenant-1', 1, '2/s', ARRAY[%s]::uuid[],"
                       " 'keys.job', '{}'::jsonb)", [first])
        (dependent,) = cursor.fetchone()
        with pytest.raises(DatabaseError) as error, transaction.atomic():
            cursor.execute("SELECT soniq_enqueue_keyed_after('', 1, NULL, ARRAY[%s]::uuid[],"
                           " 'keys.job')", [first])
    assert error.value.__cause__.sqlstate == "22023"
    assert error.value.__cause__.diag.message_hint == "SONIQ_INVALID_OPTION"
    slot = KeySlot.objects.get(key="tenant-1")
    assert (slot.configured_concurrency, slot.configured_rate_limit,
            slot.configured_rate_period) == (1, 2, 1)
    assert Job.objects.get(id=dependent).scheduled_at == WAITING_SCHEDULED_AT
    got = claim(source)
    assert source.complete_owned(got[first].claim_fence) is True
    assert KeySlot.objects.get(key="tenant-1").head == dependent
