"""Migration 0033 (decision 0052) forwards and back, with keyed jobs held back (both databases).

Its reverse puts back version 12's admission (PostgreSQL: soniq_key_admit_v1's
body from claim_protocol_v12.sql; SQLite: the trigger soniq_key_admit from
sqlite/claim_protocol_v12.sql) and the two indexes it read; reapplying gives
the exact order again. No held-back job is lost either way.
"""

import datetime as dt

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from soniq_django import enqueue
from soniq_django.keys.models import KeyParked, KeySlot
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce
from tests.support.schema import restore_latest


@pytest.fixture
def at_latest_afterwards(transactional_db):
    yield
    connection.close()
    restore_latest()


def indexes():
    with connection.cursor() as cursor:
        found = connection.introspection.get_constraints(cursor, "soniq_key_parked")
    return {name for name in found if name.startswith("soniq_key_parked_")
            and name.endswith("_idx")}


def offered_after_a_run(key):
    """The job ``key`` (in a queue of its own) offers once its one running job ends, beside a more urgent job due in
    an hour, a job due two hours ago and a more urgent one due an hour ago; and those two."""
    source = OwnedJobSource()
    now = timezone.now()
    put = lambda **options: enqueue("keys.order", {}, queue=key, concurrency_key=key,
                                    key_concurrency=1, **options)
    put()
    (running,) = source.claim_many_owned("w-1", claim_tokens=[nonce()], queues=[key])
    put(run_at=now + dt.timedelta(hours=1), priority=1)
    longest = put(run_at=now - dt.timedelta(hours=2), priority=100)
    urgent = put(run_at=now - dt.timedelta(hours=1), priority=50)
    assert source.complete_owned(running.claim_fence) is True
    return KeySlot.objects.get(key=key).head, longest, urgent


def test_reversing_0033_gives_version_12s_pick_and_reapplying_the_exact_one(
        at_latest_afterwards):
    rank = {"soniq_key_parked_rank_idx", "soniq_key_parked_due_idx"}
    assert indexes() == rank
    head, _, urgent = offered_after_a_run("before")
    assert head == urgent
    call_command("migrate", "soniq_django", "0032", verbosity=0)
    assert indexes() == {"soniq_key_parked_order_idx", "soniq_key_parked_due_idx",
                         "soniq_key_parked_now_idx"}
    head, longest, _ = offered_after_a_run("back")
    assert head == longest  # version 12: the scheduled job due longest
    parked = set(KeyParked.objects.values_list("job_id", flat=True))
    call_command("migrate", "soniq_django", verbosity=0)
    assert indexes() == rank
    assert set(KeyParked.objects.values_list("job_id", flat=True)) == parked
    head, _, urgent = offered_after_a_run("again")
    assert head == urgent
