"""Owned submissions: replay to the original id forever, conflicts otherwise."""

import datetime as dt
import uuid
from zoneinfo import ZoneInfo

import pytest
from django.test import override_settings
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.errors import ConfigValidationError, ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job
from soniq_django.owned import OwnedJobSource
from soniq_django.owned._submit import fingerprint
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


@pytest.fixture
def source():
    return OwnedJobSource()


def request(**overrides) -> JobRequest:
    values = {"job_name": "billing.send_invoice", "args": {"order_id": 1}}
    values.update(overrides)
    return JobRequest(values.pop("job_name"), values.pop("args"), **values)


def conflict_of(call) -> str:
    with pytest.raises(SoniqError) as caught:
        call()
    assert caught.value.code is ErrorCode.QUEUE_SUBMISSION_CONFLICT
    return caught.value.reason


def test_submit_writes_a_protected_format1_row(source):
    job_id = source.submit_owned(request(queue="billing"), submission_id="sub-1")
    row = Job.objects.get(id=job_id)
    assert (row.status, row.queue, row.args, row.attempts, row.claim_generation) == (
        "queued", "billing", {"order_id": 1}, 0, 0,
    )
    assert row.fence_required and row.submission_id == "sub-1"
    assert row.submission_fingerprint.startswith("v1:") and len(row.submission_fingerprint) == 67
    assert row.claim_token is None


def test_exact_replay_returns_the_original_id(source):
    first = source.submit_owned(request(), submission_id="sub-1")
    assert source.submit_owned(request(), submission_id="sub-1") == first
    assert Job.objects.count() == 1


def _finish(source, how):
    fence = source.claim_next_owned("w", claim_token=nonce()).claim_fence
    if how == "completed":
        assert source.complete_owned(fence, {"ok": 1})
    elif how == "dead-lettered":
        assert source.fail_owned(fence, "boom", retry=False)
    elif how == "cancelled":
        source.request_cancel(fence.job_id)
        assert source.acknowledge_cancel_owned(fence)
    elif how == "retried":
        assert source.fail_owned(fence, "boom", retry=True)


@pytest.mark.parametrize("how", ["completed", "dead-lettered", "cancelled", "retried"])
def test_replay_after_every_transition_returns_the_original_id(source, how):
    first = source.submit_owned(request(), submission_id="sub-1")
    _finish(source, how)
    assert source.submit_owned(request(), submission_id="sub-1") == first
    assert Job.objects.count() + DeadLetterJob.objects.count() == 1
    with pytest.raises(SoniqError):
        source.submit_owned(request(args={"order_id": 2}), submission_id="sub-1")


def test_identity_survives_the_move_to_dead_letter(source):
    first = source.submit_owned(request(), submission_id="sub-1")
    _finish(source, "dead-lettered")
    dead = DeadLetterJob.objects.get(id=first)
    assert dead.fence_required and dead.submission_id == "sub-1"
    assert dead.submission_fingerprint.startswith("v1:")


def test_replay_after_result_expiry_returns_the_original_id(source):
    first = source.submit_owned(request(), submission_id="sub-1")
    _finish(source, "completed")
    rewrite(first, expires_at=timezone.now() - dt.timedelta(days=1))
    assert source.submit_owned(request(), submission_id="sub-1") == first


@pytest.mark.parametrize(
    "changed",
    [
        {"args": {"order_id": 2}},
        {"args": {}},
        {"args": None},
        {"queue": "default"},
        {"priority": 100},
        {"max_attempts": 3},
        {"unique_job": True},
        {"dedup_key": "k"},
        {"producer_id": "p"},
        {"job_name": "billing.other"},
        {"run_at": dt.datetime(2030, 1, 1, tzinfo=dt.UTC)},
        {"active_key": "a"},
    ],
)
def test_changed_content_under_a_known_id_conflicts(source, changed):
    source.submit_owned(request(), submission_id="sub-1")
    assert conflict_of(lambda: source.submit_owned(request(**changed), submission_id="sub-1")) == (
        "submission_mismatch"
    )
    assert Job.objects.count() == 1


def test_none_and_an_empty_mapping_are_different(source):
    none = source.submit_owned(request(args=None), submission_id="a")
    empty = source.submit_owned(request(args={}), submission_id="b")
    assert Job.objects.get(id=none).args == {} == Job.objects.get(id=empty).args
    assert Job.objects.get(id=none).submission_fingerprint != fingerprint(
        request(args={}), "a", {}
    )
    conflict_of(lambda: source.submit_owned(request(args={}), submission_id="a"))


def test_a_generated_id_filled_back_into_the_request_conflicts(source):
    generated = source.submit_owned(request(), submission_id="sub-1")
    assert conflict_of(
        lambda: source.submit_owned(request(job_id=generated), submission_id="sub-1")
    ) == "submission_mismatch"


def test_an_authored_job_id_keeps_its_spelling(source):
    job_id = uuid.uuid4()
    spelled = str(job_id).upper()
    assert source.submit_owned(request(job_id=spelled), submission_id="s") == job_id
    assert source.submit_owned(request(job_id=spelled), submission_id="s") == job_id
    conflict_of(lambda: source.submit_owned(request(job_id=str(job_id)), submission_id="s"))


def test_equal_instants_with_different_offsets_match(source):
    utc = dt.datetime(2030, 5, 1, 12, 0, 0, 250, tzinfo=dt.UTC)
    paris = utc.astimezone(ZoneInfo("Europe/Paris"))
    first = source.submit_owned(request(run_at=utc), submission_id="s")
    assert source.submit_owned(request(run_at=paris), submission_id="s") == first
    conflict_of(lambda: source.submit_owned(
        request(run_at=utc + dt.timedelta(microseconds=1)), submission_id="s"))


def test_no_unicode_normalisation_in_the_fingerprint(source):
    composed, decomposed = "caf\u00e9", "cafe\u0301"
    source.submit_owned(request(args={"name": composed}), submission_id="s")
    conflict_of(lambda: source.submit_owned(request(args={"name": decomposed}), submission_id="s"))


def test_the_submission_id_is_compared_exactly(source):
    first = source.submit_owned(request(), submission_id="Sub-1")
    second = source.submit_owned(request(), submission_id="sub-1")
    third = source.submit_owned(request(), submission_id="sub-1 ")
    assert len({first, second, third}) == 3


def test_the_fingerprint_is_versioned_and_covers_the_submission_id():
    a = fingerprint(request(), "one", {"order_id": 1})
    b = fingerprint(request(), "two", {"order_id": 1})
    assert a.startswith("v1:") and a != b


def test_later_mutation_of_the_callers_args_changes_nothing(source):
    args = {"items": [1, 2]}
    job_id = source.submit_owned(request(args=args), submission_id="s")
    args["items"].append(3)
    assert Job.objects.get(id=job_id).args == {"items": [1, 2]}
    assert source.submit_owned(request(args={"items": [1, 2]}), submission_id="s") == job_id


def test_legacy_rows_are_never_promoted(source):
    legacy = enqueue("billing.send_invoice", {"order_id": 1})
    assert conflict_of(
        lambda: source.submit_owned(request(job_id=legacy), submission_id="s")
    ) == "job_id_in_use"
    row = Job.objects.get(id=legacy)
    assert not row.fence_required and row.submission_id is None


def test_a_dedup_collision_conflicts_instead_of_returning_another_job(source):
    enqueue("billing.send_invoice", {}, dedup_key="k")
    assert conflict_of(lambda: source.submit_owned(request(dedup_key="k"), submission_id="s")) == (
        "collision"
    )


@pytest.mark.parametrize(
    ("bad_request", "submission_id"),
    [
        ({"job_name": "billing.send_invoice"}, "s"),
        (request(), ""),
        (request(), "s" * 256),
        (request(), None),
        (request(), 5),
        (request(max_attempts=None), "s"),
        (request(max_attempts=True), "s"),
        (request(max_attempts=0), "s"),
        (request(max_attempts=2**31), "s"),
        (request(args={"x": float("inf")}), "s"),
        (request(job_name="Bad Name"), "s"),
        (request(active_key=""), "s"),
        (request(run_at=dt.datetime(2030, 1, 1)), "s"),
    ],
)
def test_invalid_submissions_raise_config_before_any_write(source, bad_request, submission_id):
    with pytest.raises(ConfigValidationError) as caught:
        source.submit_owned(bad_request, submission_id=submission_id)
    assert caught.value.code is ErrorCode.CONFIG
    assert not Job.objects.exists()


def test_a_subclass_of_the_request_type_is_refused(source):
    class Special(JobRequest):
        pass

    with pytest.raises(ConfigValidationError):
        source.submit_owned(Special("a.b", {}), submission_id="s")


# Active key and force -----------------------------------------------------


def test_an_active_owned_predecessor_needs_force(source):
    first = source.submit_owned(request(active_key="stream-1"), submission_id="s1")
    assert conflict_of(
        lambda: source.submit_owned(request(active_key="stream-1", args={"v": 2}), submission_id="s2")
    ) == "active_key_in_use"
    assert Job.objects.get(id=first).status == "queued"


def test_force_cancels_the_predecessor_and_inserts_atomically(source):
    first = source.submit_owned(request(active_key="stream-1"), submission_id="s1")
    second = source.submit_owned(
        request(active_key="stream-1", args={"v": 2}), submission_id="s2", force=True
    )
    assert second != first
    old, new = Job.objects.get(id=first), Job.objects.get(id=second)
    assert (old.status, old.submission_id, old.fence_required) == ("cancelled", "s1", True)
    assert new.status == "queued"


def test_force_also_displaces_a_processing_predecessor(source):
    first = source.submit_owned(request(active_key="stream-1"), submission_id="s1")
    fence = source.claim_next_owned("w", claim_token=nonce()).claim_fence
    source.submit_owned(request(active_key="stream-1", args={"v": 2}), submission_id="s2",
                        force=True)
    assert Job.objects.get(id=first).status == "cancelled"
    assert source.complete_owned(fence) is False


def test_retrying_an_old_force_request_returns_its_id_and_spares_the_successor(source):
    source.submit_owned(request(active_key="k"), submission_id="s1")
    second = source.submit_owned(request(active_key="k", args={"v": 2}), submission_id="s2",
                                 force=True)
    third = source.submit_owned(request(active_key="k", args={"v": 3}), submission_id="s3",
                                force=True)
    assert source.submit_owned(request(active_key="k", args={"v": 2}), submission_id="s2",
                               force=True) == second
    assert Job.objects.get(id=third).status == "queued"


def test_a_changed_original_conflicts_before_any_cancellation(source):
    first = source.submit_owned(request(active_key="k"), submission_id="s1")
    conflict_of(lambda: source.submit_owned(request(active_key="k", args={"v": 9}),
                                            submission_id="s1", force=True))
    assert Job.objects.get(id=first).status == "queued"


def test_a_terminal_predecessor_releases_its_key(source):
    first = source.submit_owned(request(active_key="k"), submission_id="s1")
    _finish(source, "completed")
    second = source.submit_owned(request(active_key="k", args={"v": 2}), submission_id="s2")
    assert second != first and Job.objects.get(id=first).status == "done"


def test_a_legacy_predecessor_refuses_even_with_force(source):
    legacy = enqueue("billing.send_invoice", {})
    rewrite(legacy, active_key="k")
    assert conflict_of(lambda: source.submit_owned(request(active_key="k"), submission_id="s",
                                                    force=True)) == "legacy_active_key"
    assert Job.objects.get(id=legacy).status == "queued"


def test_force_needs_a_bool(source):
    with pytest.raises(ConfigValidationError):
        source.submit_owned(request(), submission_id="s", force=1)


@override_settings(SONIQ={"DEFAULT_QUEUE": "mail"})
def test_default_queue_is_assigned_once_and_stays_out_of_the_fingerprint(source):
    first = source.submit_owned(request(), submission_id="s")
    assert Job.objects.get(id=first).queue == "mail"
    with override_settings(SONIQ={"DEFAULT_QUEUE": "other"}):
        assert source.submit_owned(request(), submission_id="s") == first


@pytest.mark.django_db(transaction=True)
def test_async_submit_snapshots_before_the_bridge(source):
    import asyncio

    from django.db import connections

    args = {"items": [1]}
    pending = source.asubmit_owned(request(args=args), submission_id="async-1")
    args["items"].append(2)  # after the call, before the await

    async def finish():
        job_id = await pending
        again = await source.asubmit_owned(request(args={"items": [1]}), submission_id="async-1")
        from asgiref.sync import sync_to_async

        await sync_to_async(connections.close_all)()
        return job_id, again

    job_id, again = asyncio.run(finish())
    assert job_id == again
    assert Job.objects.get(id=job_id).args == {"items": [1]}
