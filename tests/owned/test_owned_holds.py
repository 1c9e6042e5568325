"""Slots held by handlers that run on, and deferrals that are not starts (claim protocol v8).

Both databases, through ``OwnedJobSource``'s worker-internal calls:
``_fail_and_hold`` (soniq_hold_slot then soniq_fail, one transaction, on
PostgreSQL; SqliteClaims.fail_and_hold on SQLite), ``_renew_holds``,
``_release_hold``; and ``defer_owned`` (soniq_defer, version 8), which takes
back the start its claim recorded. The worker's use of them is tested in
tests/worker/test_holds.py.
"""

import dataclasses
import datetime as dt

import pytest
from django.db import connection
from django.utils import timezone

from soniq_django import bulk_enqueue, enqueue
from soniq_django.models import DeadLetterJob, Job, QueueHold, QueueSetting, QueueStart
from soniq_django.owned import OwnedJobSource
from soniq_django.producer.request import JobRequest
from tests.support.owned import claim, nonce, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def holds() -> list[tuple]:
    return list(QueueHold.objects.order_by("id").values_list(
        "job_id", "generation", "queue", "claim_owner"))


def lapse_holds() -> None:
    QueueHold.objects.update(lease_expires_at=timezone.now() - dt.timedelta(seconds=1))


# A timeout's failure holds the slot --------------------------------------------------


def test_a_timeouts_failure_and_its_hold_are_written_together(source, settings):
    settings.SONIQ = {"LEASE_SECONDS": 20, "RETRY_BASE_SECONDS": 0, "RETRY_MAX_SECONDS": 0}
    job_id = enqueue("held.job", queue="api", max_attempts=2)
    claimed = claim(source, worker="w-1")
    before = timezone.now()
    assert source._fail_and_hold(claimed.claim_fence, "timed out after 1 s") is True
    row = Job.objects.get(id=job_id)
    assert (row.status, row.last_error) == ("queued", "timed out after 1 s")
    assert holds() == [(job_id, claimed.claim_fence.generation, "api", "w-1")]
    lease = QueueHold.objects.get().lease_expires_at
    assert before + dt.timedelta(seconds=19) < lease < timezone.now() + dt.timedelta(seconds=21)
    # The last attempt: dead-lettered, held all the same (its handler runs on).
    again = claim(source, worker="w-1")
    assert source._fail_and_hold(again.claim_fence, "timed out after 1 s") is True
    assert DeadLetterJob.objects.get(id=job_id).dead_letter_reason == "max_retries_exceeded"
    assert [h[1] for h in holds()] == [1, 2]


def test_a_fence_that_owns_nothing_holds_nothing(source):
    enqueue("held.job", queue="api")
    claimed = claim(source)
    stale = dataclasses.replace(claimed.claim_fence, claim_token=nonce())
    assert source._fail_and_hold(stale, "timed out") is False
    rewrite(claimed.job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert source._fail_and_hold(claimed.claim_fence, "timed out") is False
    assert holds() == []
    assert Job.objects.get(id=claimed.job_id).status == "processing"


def test_a_cancel_request_refuses_the_failure_but_the_slot_is_held(source):
    # The handler still runs whatever the row says; the worker acknowledges the cancel next.
    enqueue("held.job", queue="api")
    claimed = claim(source, worker="w-1")
    assert source.request_cancel(claimed.job_id)
    assert source._fail_and_hold(claimed.claim_fence, "timed out") is False
    assert len(holds()) == 1
    assert source.acknowledge_cancel_owned(claimed.claim_fence) is True
    assert len(holds()) == 1


def test_a_hold_is_released_once_and_only_by_its_worker(source):
    enqueue("held.job", queue="api")
    claimed = claim(source, worker="w-1")
    assert source._fail_and_hold(claimed.claim_fence, "timed out") is True
    other = dataclasses.replace(claimed.claim_fence, worker_id="w-2")
    assert source._release_hold(other) is False
    assert source._release_hold(claimed.claim_fence) is True
    assert source._release_hold(claimed.claim_fence) is False
    assert holds() == []


def test_renewal_keeps_live_holds_of_the_claims_named_and_no_others(source, settings):
    settings.SONIQ = {"LEASE_SECONDS": 20}
    bulk_enqueue([JobRequest("held.job", {"n": n}, queue="api") for n in range(3)])
    first, second, third = (claim(source, worker="w-1") for _ in range(3))
    for claimed in (first, second, third):
        assert source._fail_and_hold(claimed.claim_fence, "timed out") is True
    soon = timezone.now() + dt.timedelta(seconds=5)
    QueueHold.objects.update(lease_expires_at=soon)
    QueueHold.objects.filter(job_id=third.job_id).update(
        lease_expires_at=timezone.now() - dt.timedelta(seconds=1))  # lapsed: its slot is free
    fences = [first.claim_fence, third.claim_fence]
    assert source._renew_holds("w-1", fences) == 1
    assert source._renew_holds("w-2", fences) == 0
    leases = dict(QueueHold.objects.values_list("job_id", "lease_expires_at"))
    assert leases[first.job_id] > soon + dt.timedelta(seconds=10)  # renewed
    assert leases[second.job_id] == soon  # not named
    assert leases[third.job_id] < timezone.now()  # not revived


def test_taking_a_hold_clears_the_queues_lapsed_ones(source):
    bulk_enqueue([JobRequest("held.job", {"n": n}, queue=q)
                  for n, q in enumerate(["api", "api", "other"])])
    first, second, third = (claim(source) for _ in range(3))
    assert source._fail_and_hold(first.claim_fence, "timed out") is True
    assert source._fail_and_hold(third.claim_fence, "timed out") is True
    lapse_holds()
    assert source._fail_and_hold(second.claim_fence, "timed out") is True
    assert sorted(h[0] for h in holds()) == sorted([second.job_id, third.job_id])


# A deferral is not a start -------------------------------------------------------------


def rated(queue: str, count: int = 5, period: int = 60) -> None:
    QueueSetting.objects.update_or_create(queue=queue, defaults={
        "rate_limit": count, "rate_period": period})


def test_a_deferral_takes_back_the_start_its_claim_recorded(source):
    rated("sms", count=2)
    bulk_enqueue([JobRequest("rolling.new", {"n": n}, queue="sms") for n in range(4)])
    tokens = [nonce(), nonce()]
    first, second = source.claim_many_owned("w-1", claim_tokens=tokens)  # one time, two starts
    assert QueueStart.objects.filter(queue="sms").count() == 2
    assert source.claim_many_owned("w-1", claim_tokens=[nonce()]) == []  # the rate is used up
    assert source.defer_owned(first.claim_fence, "no handler here", delay=60) is True
    assert QueueStart.objects.filter(queue="sms").count() == 1
    # The start given back is one a claim can use now.
    [third] = source.claim_many_owned("w-1", claim_tokens=[nonce()])
    assert source.defer_owned(second.claim_fence, "no handler here", delay=60) is True
    assert source.defer_owned(third.claim_fence, "no handler here", delay=60) is True
    assert QueueStart.objects.filter(queue="sms").count() == 0
    assert source.defer_owned(third.claim_fence, "again") is False  # nothing twice


def test_a_deferral_takes_back_only_its_own_claims_start(source):
    rated("sms", count=5)
    bulk_enqueue([JobRequest("rolling.new", {"n": n}, queue="sms") for n in range(2)])
    first = claim(source)
    second = claim(source)
    ours = QueueStart.objects.get(started_at=Job.objects.get(id=first.job_id).updated_at)
    assert source.defer_owned(first.claim_fence, "not here", delay=60) is True
    assert QueueStart.objects.filter(pk=ours.pk).count() == 0
    assert QueueStart.objects.count() == 1
    # A claim whose lease was renewed no longer knows its start's time: it is left to age out.
    assert source.heartbeat_owned(second.claim_fence) is True
    assert source.defer_owned(second.claim_fence, "not here", delay=60) is True
    assert QueueStart.objects.count() == 1


def test_a_deferral_in_a_queue_without_a_rate_deletes_nothing(source):
    rated("sms", count=5)
    enqueue("rolling.new", queue="sms")
    claim(source, queues=["sms"])
    enqueue("rolling.new", queue="plain")
    plain = claim(source, queues=["plain"])
    assert source.defer_owned(plain.claim_fence, "not here", delay=60) is True
    assert QueueStart.objects.count() == 1


@pytest.mark.postgresql_only
def test_the_hold_functions_are_pinned_definers_no_one_else_may_call():
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT p.proname, p.prosecdef, p.proconfig, has_function_privilege('public', "
            "p.oid, 'EXECUTE') FROM pg_proc AS p WHERE p.pronamespace = "
            "current_schema()::regnamespace AND p.proname IN ('soniq_hold_slot', "
            "'soniq_release_hold', 'soniq_renew_holds', 'soniq_defer') ORDER BY 1")
        rows = cursor.fetchall()
    names = ("soniq_defer", "soniq_hold_slot", "soniq_release_hold", "soniq_renew_holds")
    assert rows == [(name, True, ["search_path=pg_catalog, pg_temp"], False) for name in names]


@pytest.mark.postgresql_only
@pytest.mark.parametrize("call", [
    "soniq_renew_holds('w', ARRAY[]::text[], ARRAY[]::bigint[])",
    "soniq_renew_holds('w', ARRAY['a', 'b'], ARRAY[1]::bigint[])",
    "soniq_renew_holds('', ARRAY['a'], ARRAY[1]::bigint[])",
    "soniq_renew_holds('w', ARRAY['a'], ARRAY[1]::bigint[], 0)",
    "soniq_release_hold('00000000-0000-0000-0000-000000000000', 'w', 0)",
    "soniq_release_hold(NULL, 'w', 1)",
    "soniq_hold_slot('00000000-0000-0000-0000-000000000000', 'w', 1, 't', 'q', 'NaN')",
])
def test_the_hold_functions_refuse_bad_input_with_config(call):
    from django.db import DatabaseError, transaction

    with pytest.raises(DatabaseError) as caught, transaction.atomic(), connection.cursor() as c:
        c.execute(f"SELECT {call}")
    assert (caught.value.__cause__.sqlstate, caught.value.__cause__.diag.message_hint) == (
        "22023", "CONFIG")


@pytest.mark.postgresql_only
@pytest.mark.django_db(transaction=True, databases=["default", "server_binding"])
def test_a_timeouts_hold_and_failure_go_together_with_server_side_binding():
    # tests/settings.py: the same database, with OPTIONS["server_side_binding"] (one
    # statement per message: the two run one after the other in one transaction).
    bound = OwnedJobSource(using="server_binding")
    job_id = enqueue("held.job", queue="api", max_attempts=1)
    fence = bound.claim_next_owned("w-1", claim_token=nonce()).claim_fence
    assert bound._fail_and_hold(fence, "timed out") is True
    assert DeadLetterJob.objects.filter(id=job_id).exists()
    assert holds() == [(job_id, 1, "api", "w-1")]
    assert bound._release_hold(fence) is True
