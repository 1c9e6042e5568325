"""Gap 1 of issue 31: a keyed job's dead letter keeps its key, and a replay parks it
under its key again (the admin's action, the command and the function alike).

On both databases: the dead letter written by the claim protocol's move (the
SQL function on PostgreSQL, SqliteClaims on SQLite) carries the key; a replay
of it with the key at its limit does not make it claimable; the slot's count
stays its processing rows, and the key's limit holds.
"""

import io

import pytest
from django.contrib.messages import get_messages
from django.core.management import call_command
from django.urls import reverse

from soniq_django import enqueue
from soniq_django.keys.models import KEY_PARKED_AT, KeyParked, KeySlot
from soniq_django.models import DeadLetterJob, Job
from soniq_django.replay import replay_dead_letters
from tests.support.owned import nonce

pytestmark = pytest.mark.django_db


def claim(source, n=10):
    return source.claim_many_owned("w-1", claim_tokens=[nonce() for _ in range(n)])


def consistent(key="acme"):
    row = KeySlot.objects.get(key=key)
    assert row.running == Job.objects.filter(concurrency_key=key, status="processing").count()
    offered = Job.objects.filter(concurrency_key=key, status="queued").exclude(
        scheduled_at=KEY_PARKED_AT)
    assert offered.count() == (row.head is not None)
    parked = Job.objects.filter(concurrency_key=key, status="queued",
                                scheduled_at=KEY_PARKED_AT).count()
    assert KeyParked.objects.filter(key=key).count() == parked
    return row.running


def dead_keyed(source, key="acme", limit=1):
    """A keyed job dead-lettered by a worker's fenced failure; returns its id."""
    job_id = enqueue("keys.job", {"n": 0}, concurrency_key=key, key_concurrency=limit)
    (got,) = claim(source)
    assert got.job_id == job_id
    assert source.fail_owned(got.claim_fence, "bad", retry=False) is True
    return job_id


def test_the_dead_letter_keeps_the_key(source):
    job_id = dead_keyed(source)
    assert DeadLetterJob.objects.get(id=job_id).concurrency_key == "acme"
    assert consistent() == 0


def test_an_unkeyed_dead_letter_has_no_key(source):
    job_id = enqueue("plain.job", {}, max_attempts=1)
    (got,) = claim(source)
    assert source.fail_owned(got.claim_fence, "bad", retry=False) is True
    assert DeadLetterJob.objects.get(id=job_id).concurrency_key is None


def test_a_replay_at_the_keys_limit_waits_for_its_key(source):
    dead = dead_keyed(source)
    running = enqueue("keys.job", {"n": 1}, concurrency_key="acme", key_concurrency=1)
    (got,) = claim(source)
    assert got.job_id == running and consistent() == 1
    assert replay_dead_letters(ids=[dead]).replayed == (dead,)
    row = Job.objects.get(id=dead)
    assert (row.status, row.concurrency_key, row.scheduled_at) == ("queued", "acme",
                                                                   KEY_PARKED_AT)
    assert claim(source) == []  # the key is at its limit: the replayed job is not offered
    assert consistent() == 1
    assert source.complete_owned(got.claim_fence) is True
    assert consistent() == 0 and KeySlot.objects.get(key="acme").head == dead
    (again,) = claim(source)
    assert again.job_id == dead and consistent() == 1


def test_a_replay_with_room_is_offered_at_once_and_fails_back_into_its_dead_letter(source):
    dead = dead_keyed(source)
    replay_dead_letters(ids=[dead])
    assert KeySlot.objects.get(key="acme").head == dead
    (got,) = claim(source)
    assert got.job_id == dead and consistent() == 1
    assert source.fail_owned(got.claim_fence, "bad again", retry=False) is True
    assert consistent() == 0
    letter = DeadLetterJob.objects.get(id=dead)
    assert (letter.concurrency_key, letter.resurrection_count) == ("acme", 1)
    assert replay_dead_letters(ids=[dead]).replayed == (dead,)
    assert Job.objects.get(id=dead).concurrency_key == "acme" and consistent() == 0


def test_the_command_replays_under_the_key(source):
    dead = dead_keyed(source)
    enqueue("keys.job", {"n": 1}, concurrency_key="acme", key_concurrency=1)
    claim(source)
    call_command("soniq_replay", str(dead), stdout=io.StringIO())
    assert Job.objects.get(id=dead).scheduled_at == KEY_PARKED_AT
    assert claim(source) == [] and consistent() == 1


def test_the_admins_replay_action_replays_under_the_key(admin_client, source):
    dead = dead_keyed(source)
    enqueue("keys.job", {"n": 1}, concurrency_key="acme", key_concurrency=1)
    claim(source)
    response = admin_client.post(
        reverse("admin:soniq_django_deadletterjob_changelist"),
        {"action": "replay_selected", "_selected_action": [str(dead)], "index": 0})
    assert response.status_code == 302
    assert [str(m) for m in get_messages(response.wsgi_request)] == [
        "Replayed 1 dead letter into the queue."]
    assert Job.objects.get(id=dead).scheduled_at == KEY_PARKED_AT
    assert claim(source) == [] and consistent() == 1
