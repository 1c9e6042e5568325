"""Keyed slots against a model, one random step at a time (both databases).

A hypothesis ``RuleBasedStateMachine`` drives the real API -- keyed
enqueues at random priorities, ``OwnedJobSource`` claims of random batch
sizes, completions, failures retried and dead-lettered, cancels of queued
and running jobs, deferrals, timeouts that keep a hold and the holds'
releases (twice, the second one a no-op), leases that lapse and are reaped
by the next claim, keyed jobs that depend on another job (issue 31's gaps: they
wait outside their key, then take its place or are cancelled) and replays of
dead letters (back under their key) -- and keeps a model of which job of which
key runs and which slots holds keep (a dependent's release or cancellation is
read back from its row after each step; that it never runs while it waits, nor
holds a key's place, is checked). Checked after every step, for each key:

- its count (``soniq_key_slots.running``) equals the model's running jobs
  plus held slots, and never passes its limit; nor do its processing rows;
- it offers a job (a head) exactly when the model says it has room and a
  queued job: a slot released never leaves the key stuck, one released
  twice shows as a count below the model's (and, later, one run too many).

``test_the_model_finds_a_release_twice`` and ``..._a_release_never``
re-install the trigger with the bug (PostgreSQL: the function; SQLite: the
trigger) and show that the model fails. Sizes: ``SONIQ_STATEFUL_EXAMPLES`` /
``SONIQ_STATEFUL_STEPS`` (defaults 15 x 25 here).
"""

import datetime as dt
import os
import uuid
from dataclasses import dataclass

import pytest
from django.db import connection, transaction
from django.test import override_settings
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, \
    run_state_machine_as_test

from soniq_django import enqueue
from soniq_django.keys.models import KeyHold, KeyLimit, KeyParked, KeySlot, KeyStart
from soniq_django.models import DeadLetterJob, Job, JobDependency, JobWait, QueueHold
from soniq_django.replay import replay_dead_letters
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce, rewrite
from tests.support.stateful import failure_text

pytestmark = pytest.mark.django_db(transaction=True)

EXAMPLES = int(os.environ.get("SONIQ_STATEFUL_EXAMPLES", "15"))
STEPS = int(os.environ.get("SONIQ_STATEFUL_STEPS", "25"))
SETTINGS = settings(max_examples=EXAMPLES, stateful_step_count=STEPS, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow, HealthCheck.filter_too_much])
# No lease lapses unless a rule makes it; retries are due at once.
SONIQ = {"RESULT_TTL": 86400, "LEASE_SECONDS": 3600, "RETRY_BASE_SECONDS": 0,
         "RETRY_MAX_SECONDS": 0}
LIMITS = {"a": 1, "b": 2}


@dataclass
class ModelJob:
    key: str
    state: str = "queued"  # waiting (for its dependency), queued, processing, ended
    fence: object = None


def _empty_tables() -> None:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT set_config('soniq.fenced_write', 'on', true)")
        Job.objects.all().delete()
        DeadLetterJob.objects.all().delete()
        for model in (JobWait, JobDependency, QueueHold, KeyHold, KeyParked, KeyStart, KeySlot,
                      KeyLimit):
            model.objects.all().delete()


class KeyedSlots(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        _empty_tables()
        self.source = OwnedJobSource()
        self.jobs: dict[uuid.UUID, ModelJob] = {}
        self.holds: list[tuple[str, object]] = []  # (key, fence) of holds not released
        self.released: list[object] = []  # fences of released holds

    def _of(self, state):
        # In enqueue order (never by id: ids are random, and a replay must draw alike).
        return [i for i, j in self.jobs.items() if j.state == state]

    def _running(self, key):
        return sum(1 for j in self.jobs.values() if j.key == key and j.state == "processing")

    def _held(self, key):
        return sum(1 for k, _ in self.holds if k == key)

    def _settle(self):
        """The waiting jobs' release or cancellation, read back from their rows."""
        for job_id, job in self.jobs.items():
            if job.state != "waiting":
                continue
            status = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
            if status == "cancelled":
                job.state = "ended"
            elif status == "queued":
                if not JobWait.objects.filter(job_id=job_id).exists():
                    job.state = "queued"
            else:
                raise AssertionError(f"a job waiting for its dependency became {status}")

    # Rules ------------------------------------------------------------

    @rule(key=st.sampled_from(sorted(LIMITS)), priority=st.sampled_from([1, 50, 100]))
    def put(self, key, priority):
        job_id = enqueue("kmodel.job", {}, concurrency_key=key, key_concurrency=LIMITS[key],
                         priority=priority)
        self.jobs[job_id] = ModelJob(key)

    @precondition(lambda self: self.jobs)
    @rule(key=st.sampled_from(sorted(LIMITS)), priority=st.sampled_from([1, 50, 100]),
          data=st.data())
    def put_after(self, key, priority, data):
        dependency = data.draw(st.sampled_from(list(self.jobs)))
        job_id = enqueue("kmodel.job", {}, concurrency_key=key, key_concurrency=LIMITS[key],
                         priority=priority, depends_on=[dependency])
        self.jobs[job_id] = ModelJob(key, state="waiting")
        self._settle()  # a dependency already done or failed: released or cancelled at once

    @precondition(lambda self: any(j.state == "ended" for j in self.jobs.values()))
    @rule(data=st.data())
    def replay(self, data):
        dead = [i for i in self._of("ended")
                if DeadLetterJob.objects.filter(id=i).exists()
                and not Job.objects.filter(id=i).exists()]
        if not dead:
            return
        job_id = data.draw(st.sampled_from(dead))
        assert replay_dead_letters(ids=[job_id]).replayed == (job_id,)
        assert Job.objects.get(id=job_id).concurrency_key == self.jobs[job_id].key
        self.jobs[job_id].state = "queued"

    @rule(n=st.integers(1, 4))
    def claim(self, n):
        got = self.source.claim_many_owned("w-model", claim_tokens=[nonce() for _ in range(n)])
        for claimed in got:
            assert self.jobs[claimed.job_id].state != "waiting", "a waiting job was claimed"
        self._settle()  # the reaper may have ended a dependency
        for claimed in got:
            job = self.jobs[claimed.job_id]
            assert job.state in ("queued", "processing")  # processing: a lapsed one, reaped
            job.state, job.fence = "processing", claimed.claim_fence
            assert self._running(job.key) + self._held(job.key) <= LIMITS[job.key], job.key
        if not got:  # nothing claimable: no key has both room and a due queued job
            for key, limit in LIMITS.items():
                waiting = any(j.key == key and j.state == "queued" for j in self.jobs.values())
                assert not (waiting and self._running(key) + self._held(key) < limit), (
                    f"key {key} has room and a queued job, and nothing was claimed")

    def _pick(self, data):
        running = self._of("processing")
        return data.draw(st.sampled_from(running)) if running else None

    @precondition(lambda self: self._of("processing"))
    @rule(data=st.data(), how=st.sampled_from(["done", "retry", "dead", "cancel", "defer",
                                               "timeout", "lapse"]))
    def end(self, data, how):
        job_id = data.draw(st.sampled_from(self._of("processing")))
        job = self.jobs[job_id]
        fence = job.fence
        if how == "done":
            assert self.source.complete_owned(fence) is True
            job.state = "ended"
        elif how == "retry":
            assert self.source.fail_owned(fence, "boom", retry=True, retry_delay=0) is True
            job.state = "queued" if Job.objects.filter(id=job_id, status="queued").exists() \
                else "ended"
        elif how == "dead":
            assert self.source.fail_owned(fence, "bad", retry=False) is True
            job.state = "ended"
        elif how == "cancel":
            assert self.source.request_cancel(job_id) is True
            assert self.source.acknowledge_cancel_owned(fence) is True
            job.state = "ended"
        elif how == "defer":
            assert self.source.defer_owned(fence, "not here", delay=0) is True
            job.state = "queued"
        elif how == "timeout":
            assert self.source._fail_and_hold(fence, "timed out after 1 s") is True
            self.holds.append((job.key, fence))
            job.state = "queued" if Job.objects.filter(id=job_id, status="queued").exists() \
                else "ended"
        else:  # its lease lapses: the next claim reaps it (back to queued, or dead)
            rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))
            self.source.claim_many_owned("w-reaper", claim_tokens=[nonce()], queues=["none"])
            status = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
            job.state = "queued" if status == "queued" else (
                "processing" if status == "processing" else "ended")
            assert status != "processing", "the reaper left a lapsed job processing"
        self._settle()

    @precondition(lambda self: self.holds or self.released)
    @rule(data=st.data())
    def release(self, data):
        if self.holds and (not self.released or data.draw(st.booleans())):
            key, fence = self.holds.pop(data.draw(st.integers(0, len(self.holds) - 1)))
            assert self.source._release_hold(fence) is True
            self.released.append(fence)
        else:  # released before: a second release is refused and changes nothing
            fence = data.draw(st.sampled_from(self.released))
            assert self.source._release_hold(fence) is False

    @precondition(lambda self: any(j.state == "queued" for j in self.jobs.values()))
    @rule(data=st.data())
    def cancel_queued(self, data):
        job_id = data.draw(st.sampled_from(self._of("queued")))
        assert self.source.request_cancel(job_id) is True
        self.jobs[job_id].state = "ended"
        self._settle()

    # Invariants --------------------------------------------------------

    @invariant()
    def a_waiting_job_holds_no_place_of_its_key(self):
        waiting = [i for i in self._of("waiting")]
        assert not KeyParked.objects.filter(job_id__in=waiting).exists()
        assert not KeySlot.objects.filter(head__in=waiting).exists()

    @invariant()
    def counts_match_the_model_and_never_pass_the_limit(self):
        slots = {s.key: s for s in KeySlot.objects.all()}
        for key, limit in LIMITS.items():
            if key not in slots:
                continue
            slot = slots[key]
            expected = self._running(key) + self._held(key)
            assert slot.running == expected, (
                f"key {key}: count {slot.running}, model {expected} (released twice or never)")
            assert slot.running <= limit
            processing = Job.objects.filter(concurrency_key=key, status="processing").count()
            assert processing <= limit
            waiting = any(j.key == key and j.state == "queued" for j in self.jobs.values())
            assert (slot.head is not None) == (waiting and expected < limit), (
                f"key {key}: offers {slot.head}, room {limit - expected}, waiting {waiting}")


def test_keyed_slots_state_machine():
    with override_settings(SONIQ=SONIQ):
        run_state_machine_as_test(KeyedSlots, settings=SETTINGS)


# "Release twice" and "release never", re-introduced ---------------------------------

PG_RELEASE = "            v_delta := v_delta - 1;"
SQLITE_RELEASE = "UPDATE soniq_key_slots SET running = running - 1, updated_at"


def _reinstall(bug: str):
    """Install the keyed move with ``bug`` ("twice" or "never"); returns the undo."""
    from soniq_django.sql import SQL_DIR, fill_schema, released_function, sqlite_statements

    if connection.vendor == "postgresql":
        released = released_function("claim_protocol_v12.sql", "soniq_key_moved_v1")
        assert PG_RELEASE in released
        broken = released.replace(PG_RELEASE, PG_RELEASE.replace(
            "- 1", "- 2" if bug == "twice" else "- 0"))

        def install(text):
            with connection.cursor() as cursor:
                cursor.execute("SELECT quote_ident(current_schema())")
                cursor.execute(fill_schema(text, cursor.fetchone()[0]))
        install(broken)
        return lambda: install(released)
    text = (SQL_DIR / "sqlite" / "claim_protocol_v12.sql").read_text(encoding="utf-8")
    (moved,) = [s for s in sqlite_statements(text) if "TRIGGER soniq_key_moved " in s]
    assert SQLITE_RELEASE in moved
    broken = moved.replace(SQLITE_RELEASE, SQLITE_RELEASE.replace(
        "- 1", "- 2" if bug == "twice" else "- 0"))

    def swap(statement):
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER soniq_key_moved")
            cursor.execute(statement)
    swap(broken)
    return lambda: swap(moved)


@pytest.mark.version_independent
@pytest.mark.parametrize("bug", ["twice", "never"])
def test_the_model_finds_a_release_twice_and_a_release_never(bug):
    undo = _reinstall(bug)
    try:
        found = settings(SETTINGS, max_examples=100, stateful_step_count=15,
                         phases=[Phase.generate], database=None, print_blob=False)
        with override_settings(SONIQ=SONIQ), pytest.raises((AssertionError, Flaky)) as error:
            run_state_machine_as_test(KeyedSlots, settings=found)
    finally:
        undo()
    message = failure_text(error.value)
    assert "released twice or never" in message or "room" in message, message
