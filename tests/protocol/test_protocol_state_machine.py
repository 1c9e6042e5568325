"""The owned claim protocol against a model, one random step at a time.

A hypothesis ``RuleBasedStateMachine`` drives the real API (``enqueue``,
``OwnedJobSource``, dead-letter replay) on the test database with random
sequences of steps, keeps a small model of what every job should look like,
predicts the answer of every call from the model and, after every step,
compares the whole database with the model.

Steps: ``enqueue`` with and without ``unique_job``/``dedup_key`` (tiny pools
of names, args and keys so that twins collide), with ``max_attempts=None``
(half the time), and with a job id that is already taken; the twin of a
running unique/dedup job, after which the running attempt fails with retry
or lapses; ``submit_owned`` of random requests (``active_key``, ``force``,
explicit job ids, changed content under a known submission id), exact
replays of earlier submissions, forced replacements; claims by several workers
(``claim_next_owned``, ``claim_many_owned``, fresh nonces); ``complete``,
``fail`` (``retry`` True and False, ``retry_delay=0`` so a retried job is due
again), ``defer`` (``delay=0``), ``heartbeat``, ``set_pid``, ``acknowledge_cancel`` and
``recover_owned_claim`` with live and stale fences;
a claim whose answer is lost (the claim made, its answer dropped, the
claims found again by their nonces with ``recover_owned_claim``);
on PostgreSQL, a claim while another connection holds the queue's
``soniq_queue_settings`` row (an operator's open ``SELECT ... FOR UPDATE``;
the queue has a limit that never binds), and a fenced write (``complete``,
``fail``, ``heartbeat``) with a ``lock_wait`` that meets another connection's
lock on the job's row;
lease lapses (the row's ``lease_expires_at`` is moved into the past with
``tests.owned_helpers.rewrite``; the next claim reaps it), also over and
over (a job that kills every worker running it); ``request_cancel``
of known and unknown ids; dead-letter replay; handler registry rows
(``soniq_task_registry.max_attempts``) that set a job's default attempts.

Checked on every step:

- a claim never raises (the reaper never makes a claim fail);
- every answer is the one the model predicts: a stale fence (an earlier
  generation, a lapsed lease, a finished job) never gets True from
  complete, fail, heartbeat, set_pid or acknowledge, nor a claim from
  recover; a live one does;
- no job is lost: every id the model knows is in ``soniq_jobs`` or
  ``soniq_dead_letter_jobs``, in the predicted state, and ``get_job`` finds
  it (``RESULT_TTL`` is a day; a forced replacement's predecessor, a
  superseded retry, a cancelled job stay readable);
- no job is held by two live claims: each processing row carries exactly the
  model's live fence, and whenever a job's state changes, every fence ever
  issued for it is probed with ``get_owned_state``: only the live one owns
  it;
- a submission id always replays to its first job id, and no row (dead
  letters included) ever changes its submission id or fingerprint;
- every row is terminal (done, cancelled, dead-lettered) or can run again
  (queued and due, or processing with a lease that will lapse and be
  reaped);
- a deferral (``defer_owned``) gives back the attempt its claim counted: the
  job is queued again with the attempts it had before that claim (or, like a
  retry, superseded by a queued twin);
- a retry (``fail_owned(retry=True)`` or a reaped lapse) of a unique/dedup job
  whose queued slot is taken by a queued twin finishes the failed row as
  ``cancelled`` with ``last_error`` starting "superseded" and naming the
  twin (``fail_owned`` answers True);
- ``enqueue(job_id=...)`` of an id that exists only in the dead letters
  raises ``DUPLICATE_JOB_ID``; ``submit_owned`` of it raises
  ``QUEUE_SUBMISSION_CONFLICT`` (tried for every job as it becomes only a
  dead letter);
- a lapsed claim of a job with ``max_attempts`` NULL counts against the job
  name's registry row (``soniq_task_registry.max_attempts``), else 4: at
  that many attempts the reaper dead-letters it as ``max_retries_exceeded``
  instead of queueing it again forever;
- a claim that meets a locked settings row answers at once and claims
  nothing (the queue is held back for that round; issue 26), and a write
  whose ``lock_wait`` runs out raises ``QUEUE_PERSISTENCE_FAILED``
  (``lock_not_available``) and writes nothing: the model does not move, and
  the next steps find the database as it was;
- a claim whose answer was lost is found by its nonces, exactly the claim
  the model predicts, and nothing is claimed twice;
- ``request_cancel`` answers True for a queued or processing job and False
  otherwise, an unknown id included. (For a processing job whose lease has
  lapsed, cancelling at once and recording a request that the next reap
  turns into a cancel are both accepted.)

Each example starts from empty job, dead-letter and registry tables
(``transactional_db``: every call commits, so PostgreSQL's ``now()`` moves on
as it does in production). The suite's run is short:
``SONIQ_STATEFUL_EXAMPLES`` examples of at most ``SONIQ_STATEFUL_STEPS``
steps, 30 and 40 by default (seconds per backend). A longer search, both
backends::

    SONIQ_STATEFUL_EXAMPLES=500 make test ARGS="tests/protocol/test_protocol_state_machine.py"

or one backend at a time, e.g.::

    SONIQ_STATEFUL_EXAMPLES=500 SONIQ_TEST_BACKEND=sqlite \\
        .venv/bin/python -m pytest tests/protocol/test_protocol_state_machine.py -q

A failure prints the shortest step sequence hypothesis found; it is kept in
``.hypothesis/`` and tried first on the next run.
"""

import datetime as dt
import itertools
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field

import psycopg
import pytest
from django.db import connection
from django.test import override_settings
from django.utils import timezone
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from soniq_django.errors import ErrorCode, SoniqError
from soniq_django.producer.request import JobRequest
from soniq_django.models import DeadLetterJob, Job, QueueSetting, TaskRegistration
from soniq_django.owned import OwnedJobSource, QueueClaimFence
from soniq_django.producer import enqueue, get_job
from soniq_django.replay import GENERATION_STRIDE, replay_dead_letters
from soniq_django.worker.flight import Flights, InFlight
from tests.support.owned import nonce, rewrite
from tests.support.stateful import empty_tables, stateful_settings

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = stateful_settings(30, 40)

# A day: nothing the model knows may expire during an example. The lease is
# long too: leases lapse only when a step says so.
SONIQ = {"RESULT_TTL": 86400, "LEASE_SECONDS": 3600}

# Tiny pools, so that unique jobs, dedup keys, submission ids and active keys collide.
NAMES = ("t.a", "t.b")
ARGS = ({}, {"n": 1})
DEDUP_KEYS = (None, "k1", "k2")
SUBMISSION_IDS = ("s1", "s2", "s3")
ACTIVE_KEYS = (None, "a1", "a2")
WORKERS = ("w1", "w2", "w3")
# NULL (the handler's default, else 4) half the time: the limit the reaper must count lapses
# against.
ENQUEUE_MAX_ATTEMPTS = st.one_of(st.none(), st.sampled_from((1, 2, 4)))
OWNED_MAX_ATTEMPTS = (1, 2, 4)  # submit_owned refuses None

DEFAULT_MAX_ATTEMPTS = 4  # for max_attempts NULL without a registry row
REAP_BATCH = 10  # lapsed leases a claim settles first
# The queue every job of the model goes to: on PostgreSQL it gets a limit that never binds, so
# that its soniq_queue_settings row is one a claim reads (and an operator can lock).
QUEUE = "default"
NEVER_BINDING = 1000
LOCK_WAIT = 0.01  # seconds: a write's lock_wait that runs out against another connection's lock


@dataclass
class DeadLetter:
    reason: str
    resurrections: int = 0
    replayed: bool = False  # replayed, and not dead-lettered again since


@dataclass
class ModelJob:
    name: str  # short label for messages: job0, job1, ...
    id: uuid.UUID
    job_name: str
    args: dict
    max_attempts: int | None
    unique: bool = False
    dedup_key: str | None = None
    active_key: str | None = None
    submission_id: str | None = None
    status: str | None = "queued"  # None: not in soniq_jobs
    attempts: int = 0
    generation: int = 0
    fence: QueueClaimFence | None = None  # the live claim's fence while processing
    lapsed: int | None = None  # lapse order while the lease is in the past
    cancel_requested: bool = False
    superseded_by: frozenset = field(default_factory=frozenset)
    dead: DeadLetter | None = None

    def describe(self) -> str:
        return (f"{self.name}({self.job_name} args={self.args} unique={self.unique} "
                f"dedup={self.dedup_key} max_attempts={self.max_attempts} "
                f"attempts={self.attempts} status={self.status})")


@contextmanager
def must_not_raise(what: str):
    try:
        yield
    except SoniqError as error:
        raise AssertionError(
            f"{what} raised SoniqError({error.code.value}, {error.reason!r})"
        ) from error


def expect_error(code: ErrorCode, what: str, call) -> None:
    try:
        result = call()
    except SoniqError as error:
        assert error.code is code, f"{what}: expected {code.value}, got {error.code.value}"
        return
    raise AssertionError(f"{what}: expected SoniqError({code.value}), but it returned {result!r}")


class OwnedProtocol(RuleBasedStateMachine):
    """Random steps on the real database, each predicted by the model in ``self.jobs``.

    The model holds every job an example created (by a short label, ``job0``
    and on), where it is (``status``; None when only its dead letter is left),
    its attempts, generation and live fence, whether its lease lapsed, and
    its dead letter. Each rule computes the expected answer from the model,
    makes the call, asserts the answer, and then moves the model on.
    """

    def __init__(self):
        super().__init__()
        empty_tables(TaskRegistration)
        self.source = OwnedJobSource()
        self.jobs: dict[uuid.UUID, ModelJob] = {}
        self.registry: dict[str, int] = {}
        self.submitted: dict[str, tuple[JobRequest, uuid.UUID]] = {}
        self.fences: dict[str, QueueClaimFence] = {}  # every fence ever issued, by label
        # Each worker's registry of the runs it has in flight, as the worker
        # keeps it (worker/flight.py); a run stays open after its lease lapses
        # (its handler runs on) until ``a_run_ends``.
        self.flights = {worker: Flights() for worker in WORKERS}
        self.runs: dict[str, InFlight] = {}  # open runs, by fence label
        self.fingerprints: dict[str, str] = {}  # submission id -> fingerprint first seen
        self.dead_identity: dict[uuid.UUID, tuple] = {}  # dead letter -> identity first seen
        self.checked: dict[uuid.UUID, tuple] = {}  # job -> model state last probed
        self.lapses = 0
        self.past = timezone.now() - dt.timedelta(hours=1)
        self.counter = itertools.count()
        self.other: psycopg.Connection | None = None  # an operator's connection (PostgreSQL)
        if connection.vendor == "postgresql":
            QueueSetting.objects.update_or_create(queue=QUEUE,
                                                  defaults={"concurrency": NEVER_BINDING})

    def teardown(self):
        if self.other is not None:
            self.other.close()

    def _operator(self) -> psycopg.Connection:
        """Another session on the test database, as an operator's psql would be."""
        if self.other is None or self.other.closed:
            s = connection.settings_dict
            self.other = psycopg.connect(
                dbname=s["NAME"], user=s["USER"], password=s["PASSWORD"] or None,
                host=s["HOST"] or None, port=s["PORT"] or None, connect_timeout=10)
        return self.other

    # Model ------------------------------------------------------------

    def _add(self, job_id, **values) -> ModelJob:
        assert job_id not in self.jobs, f"a new job got the id of {self.jobs[job_id].name}"
        job = ModelJob(name=f"job{len(self.jobs)}", id=job_id, **values)
        self.jobs[job_id] = job
        return job

    def _named(self, label: str) -> ModelJob:
        return next(j for j in self.jobs.values() if j.name == label)

    def limit(self, job: ModelJob) -> int:
        if job.max_attempts is not None:
            return job.max_attempts
        return self.default_attempts(job.job_name)

    def default_attempts(self, job_name: str) -> int:
        return self.registry.get(job_name, DEFAULT_MAX_ATTEMPTS)

    def slot_holders(self, job, exclude=()) -> tuple[ModelJob | None, ModelJob | None]:
        """The queued jobs holding ``job``'s queued slot: (by dedup key, by unique args)."""
        by_key = by_args = None
        for other in self.jobs.values():
            if other.id == job.id or other.status != "queued" or other.id in exclude:
                continue
            if job.dedup_key is not None and other.dedup_key == job.dedup_key:
                by_key = other
            if (job.unique and other.unique and other.job_name == job.job_name
                    and other.args == job.args):
                by_args = other
        return by_key, by_args

    def twins(self, job, exclude=()) -> frozenset:
        return frozenset(t.id for t in self.slot_holders(job, exclude) if t is not None)

    def requeue(self, job: ModelJob) -> None:
        """A retry: back to queued, or superseded by a queued twin."""
        job.fence, job.lapsed = None, None
        twins = self.twins(job)
        if twins:
            job.status, job.superseded_by = "cancelled", twins
        else:
            job.status = "queued"

    def to_dead_letter(self, job: ModelJob, reason: str) -> None:
        if job.dead is None:
            job.dead = DeadLetter(reason)
        else:
            job.dead.reason, job.dead.replayed = reason, False
        job.status, job.fence, job.lapsed, job.cancel_requested = None, None, None, False

    def reap(self) -> list[tuple[ModelJob, str]]:
        """What a claim's reaper does first; returns (job, expected outcome) pairs."""
        lapsed = sorted(
            (j for j in self.jobs.values() if j.status == "processing" and j.lapsed is not None),
            key=lambda j: j.lapsed,
        )[:REAP_BATCH]
        settled = []
        for job in lapsed:
            if job.cancel_requested:
                job.status, job.fence, job.lapsed = "cancelled", None, None
                settled.append((job, "cancelled (cancel requested)"))
            elif job.attempts >= self.limit(job):
                self.to_dead_letter(job, "max_retries_exceeded")
                settled.append((job, "dead letter max_retries_exceeded"))
            else:
                self.requeue(job)
                settled.append((job, "superseded" if job.status == "cancelled" else "queued"))
        return settled

    def is_live(self, fence: QueueClaimFence) -> bool:
        job = self.jobs.get(uuid.UUID(fence.job_id))
        return (job is not None and job.status == "processing" and job.fence == fence
                and job.lapsed is None)

    def _job_of(self, fence: QueueClaimFence) -> ModelJob:
        return self.jobs[uuid.UUID(fence.job_id)]

    def _labels(self, jobs) -> list[str]:
        return [j.name for j in jobs]

    def _draw_job(self, data, jobs, label="job") -> ModelJob:
        return self._named(data.draw(st.sampled_from(self._labels(jobs)), label=label))

    def _took(self, claimed, eligible: set, worker: str, token: str) -> None:
        job = self.jobs.get(claimed.job_id)
        assert job is not None, "a claim returned a job the model does not know"
        assert claimed.job_id in eligible, (
            f"claimed {job.describe()}, which was not queued and due")
        eligible.discard(claimed.job_id)
        fence = claimed.claim_fence
        assert (fence.job_id, fence.worker_id, fence.claim_token) == (
            str(job.id), worker, token)
        assert fence.generation == job.generation + 1, (
            f"{job.name}: generation {fence.generation} after {job.generation}")
        assert claimed.attempts == job.attempts + 1, f"{job.name}: attempts {claimed.attempts}"
        assert (claimed.job_name, claimed.args, claimed.max_attempts) == (
            job.job_name, job.args, job.max_attempts)
        job.status, job.attempts, job.generation = "processing", job.attempts + 1, fence.generation
        job.fence, job.lapsed, job.cancel_requested = fence, None, False
        self.fences[f"{job.name}.g{fence.generation}"] = fence
        self.runs[f"{job.name}.g{fence.generation}"] = self.flights[worker].track(claimed)

    def _check_settled(self, settled, claimed_ids) -> None:
        """Where each job the reaper settled must be now (clear messages for the report).

        ``claimed_ids``: what the claim itself took; a job queued again by its
        reaper may be among them.
        """
        for job, outcome in settled:
            row = Job.objects.filter(id=job.id).first()
            dead = DeadLetterJob.objects.filter(id=job.id).first()
            found = row.status if row is not None else (
                f"dead letter {dead.dead_letter_reason}" if dead is not None else "missing")
            if job.id in claimed_ids:
                found += " (and claimed again by this claim)"
            if outcome.startswith("dead letter"):
                assert row is None and dead is not None and (
                    dead.dead_letter_reason == "max_retries_exceeded"), (
                    f"{job.describe()} lapsed at {job.attempts} attempts, its limit "
                    f"{self.limit(job)} (registry: {self.registry}): expected the reaper to "
                    f"dead-letter it as max_retries_exceeded, found {found}")
            elif outcome == "superseded":
                assert row is not None and row.status == "cancelled", (
                    f"{job.describe()} lapsed while a queued twin held its slot: expected "
                    f"the reaper to finish it as cancelled (superseded), found {found}")
            else:
                expected = "cancelled" if outcome.startswith("cancelled") else (
                    "processing" if job.id in claimed_ids else "queued")
                assert row is not None and row.status == expected, (
                    f"{job.describe()} lapsed: expected {outcome}, found {found}")

    # Enqueue ----------------------------------------------------------

    @initialize(jobs=st.lists(
        st.tuples(st.sampled_from(NAMES), st.sampled_from(ARGS), st.booleans(),
                  st.sampled_from(DEDUP_KEYS), ENQUEUE_MAX_ATTEMPTS),
        min_size=1, max_size=4))
    def enqueue_some(self, jobs):
        """Start every example with a few jobs, so that its steps have work to do."""
        for job_name, args, unique, dedup_key, max_attempts in jobs:
            self.enqueue_job(job_name, args, unique, dedup_key, max_attempts)

    @rule(job_name=st.sampled_from(NAMES), args=st.sampled_from(ARGS), unique=st.booleans(),
          dedup_key=st.sampled_from(DEDUP_KEYS),
          max_attempts=ENQUEUE_MAX_ATTEMPTS)
    def enqueue_job(self, job_name, args, unique, dedup_key, max_attempts):
        probe = ModelJob(name="new", id=uuid.uuid4(), job_name=job_name, args=args,
                         max_attempts=max_attempts, unique=unique, dedup_key=dedup_key)
        by_key, by_args = self.slot_holders(probe)
        with must_not_raise("enqueue"):
            got = enqueue(job_name, args, max_attempts=max_attempts, unique_job=unique,
                          dedup_key=dedup_key)
        twin = by_key or by_args
        if twin is not None:
            assert got == twin.id, f"enqueue of a twin of {twin.describe()} returned another id"
            return
        self._add(got, job_name=job_name, args=args, max_attempts=max_attempts,
                  unique=unique, dedup_key=dedup_key)

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def enqueue_taken_job_id(self, data):
        job = self._draw_job(data, self.jobs.values())
        where = "soniq_jobs" if job.status is not None else "only soniq_dead_letter_jobs"
        expect_error(ErrorCode.DUPLICATE_JOB_ID,
                     f"enqueue(job_id=<id of {job.name}, in {where}>)",
                     lambda: enqueue("t.a", {}, job_id=job.id))

    def _running_with_key(self) -> list[ModelJob]:
        return [j for j in self._processing() if j.unique or j.dedup_key is not None]

    @precondition(lambda self: self._running_with_key())
    @rule(data=st.data(), then=st.sampled_from(("retry", "lapse")))
    def enqueue_twin(self, data, then):
        """The same unique/dedup job is enqueued again while it runs, and then the running
        attempt fails with retry or its lease lapses (the next claim reaps it): the queued
        twin holds the slot that retry needs."""
        job = self._draw_job(data, self._running_with_key())
        self.enqueue_job(job.job_name, job.args, job.unique, job.dedup_key, job.max_attempts)
        if then == "retry":
            self._fail(job.fence, True)
        else:
            self._lapse(job)

    # Owned submissions ------------------------------------------------

    def _predict_submit(self, request: JobRequest, submission_id: str, force: bool):
        """("replay", id), ("conflict", why) or ("insert", predecessor or None)."""
        if submission_id in self.submitted:
            first, first_id = self.submitted[submission_id]
            if first == request:
                return "replay", first_id
            return "conflict", "changed content under a known submission id"
        if request.job_id is not None and request.job_id in self.jobs:
            return "conflict", f"job id of {self.jobs[request.job_id].name} already used"
        predecessor = None
        if request.active_key is not None:
            holders = [j for j in self.jobs.values() if j.active_key == request.active_key
                       and j.status in ("queued", "processing")]
            if holders:
                if not force:
                    return "conflict", f"active key held by {holders[0].name}"
                predecessor = holders[0]
        probe = ModelJob(name="new", id=uuid.uuid4(), job_name=request.job_name,
                         args=request.args, max_attempts=request.max_attempts,
                         unique=request.unique_job, dedup_key=request.dedup_key)
        exclude = () if predecessor is None else (predecessor.id,)
        if self.twins(probe, exclude):
            return "conflict", "a queued twin holds the slot"
        return "insert", predecessor

    def _submit(self, request: JobRequest, submission_id: str, force: bool) -> None:
        kind, detail = self._predict_submit(request, submission_id, force)
        what = f"submit_owned({request}, submission_id={submission_id!r}, force={force})"
        if kind == "conflict":
            expect_error(ErrorCode.QUEUE_SUBMISSION_CONFLICT, f"{what} [{detail}]",
                         lambda: self.source.submit_owned(
                             request, submission_id=submission_id, force=force))
            return
        with must_not_raise(what):
            got = self.source.submit_owned(request, submission_id=submission_id, force=force)
        if kind == "replay":
            assert got == detail, (
                f"submission {submission_id!r} replayed to another id than its first "
                f"({self.jobs[detail].name})")
            return
        predecessor = detail
        if predecessor is not None:
            predecessor.status, predecessor.fence, predecessor.lapsed = "cancelled", None, None
        if request.job_id is not None:
            assert got == request.job_id
        self._add(got, job_name=request.job_name, args=request.args,
                  max_attempts=request.max_attempts, unique=request.unique_job,
                  dedup_key=request.dedup_key, active_key=request.active_key,
                  submission_id=submission_id)
        self.submitted[submission_id] = (request, got)
        if predecessor is not None:
            info = get_job(predecessor.id)
            assert info is not None and info.status == "cancelled", (
                f"{predecessor.name}, replaced by a forced submission, should stay readable as "
                f"cancelled for RESULT_TTL; get_job returned {info}")

    @rule(data=st.data(), submission_id=st.sampled_from(SUBMISSION_IDS),
          job_name=st.sampled_from(NAMES), args=st.sampled_from(ARGS), unique=st.booleans(),
          dedup_key=st.sampled_from(DEDUP_KEYS), active_key=st.sampled_from(ACTIVE_KEYS),
          max_attempts=st.sampled_from(OWNED_MAX_ATTEMPTS), force=st.booleans())
    def submit(self, data, submission_id, job_name, args, unique, dedup_key, active_key,
               max_attempts, force):
        choice = data.draw(st.sampled_from(["none", "fresh"] + self._labels(self.jobs.values())),
                           label="job_id")
        job_id = {"none": None, "fresh": uuid.uuid4()}.get(choice)
        if job_id is None and choice != "none":
            job_id = self._named(choice).id
        request = JobRequest(job_name, args, max_attempts=max_attempts, unique_job=unique,
                             dedup_key=dedup_key, job_id=job_id, active_key=active_key)
        self._submit(request, submission_id, force)

    @precondition(lambda self: self.submitted)
    @rule(data=st.data(), force=st.booleans())
    def replay_submission(self, data, force):
        submission_id = data.draw(st.sampled_from(sorted(self.submitted)), label="submission")
        request, _ = self.submitted[submission_id]
        self._submit(request, submission_id, force)

    def _active_holders(self) -> list[ModelJob]:
        return [j for j in self.jobs.values()
                if j.active_key is not None and j.status in ("queued", "processing")]

    @precondition(lambda self: self._active_holders())
    @rule(data=st.data())
    def force_replace(self, data):
        holder = self._draw_job(data, self._active_holders(), label="predecessor")
        request = JobRequest("t.b", {"replaces": holder.name}, active_key=holder.active_key)
        self._submit(request, f"replace-{next(self.counter)}", True)

    # Claims -----------------------------------------------------------

    def _eligible(self) -> set:
        return {j.id for j in self.jobs.values() if j.status == "queued"}

    @precondition(lambda self: self.jobs)
    @rule(worker=st.sampled_from(WORKERS))
    def claim(self, worker):
        settled = self.reap()
        eligible = self._eligible()
        token = nonce()
        with must_not_raise(f"claim_next_owned (reaping {[(j.name, o) for j, o in settled]})"):
            claimed = self.source.claim_next_owned(worker, claim_token=token)
        self._check_settled(settled, set() if claimed is None else {claimed.job_id})
        if not eligible:
            assert claimed is None, "a claim found a job although none was queued"
        else:
            assert claimed is not None, "a claim found nothing although a job was queued"
            self._took(claimed, eligible, worker, token)

    @precondition(lambda self: self.jobs)
    @rule(worker=st.sampled_from(WORKERS), count=st.integers(1, 3))
    def claim_many(self, worker, count):
        settled = self.reap()
        eligible = self._eligible()
        tokens = [nonce() for _ in range(count)]
        with must_not_raise(f"claim_many_owned (reaping {[(j.name, o) for j, o in settled]})"):
            claimed = self.source.claim_many_owned(worker, claim_tokens=tokens)
        self._check_settled(settled, {one.job_id for one in claimed})
        assert len(claimed) == min(count, len(eligible))
        for one, token in zip(claimed, tokens):
            self._took(one, eligible, worker, token)

    @precondition(lambda self: self.jobs)
    @rule(worker=st.sampled_from(WORKERS), count=st.integers(1, 3))
    def claim_whose_answer_is_lost(self, worker, count):
        """The claim commits, its answer never reaches the worker: it asks by its nonces."""
        settled = self.reap()
        eligible = self._eligible()
        tokens = [nonce() for _ in range(count)]
        with must_not_raise("claim_many_owned (its answer then dropped)"):
            self.source.claim_many_owned(worker, claim_tokens=tokens)
        with must_not_raise("recover_owned_claim after a lost answer"):
            found = [self.source.recover_owned_claim(worker, claim_token=t) for t in tokens]
        claimed = [one for one in found if one is not None]
        # The i-th job claimed carries the i-th nonce: the unused ones are the last.
        assert found == claimed + [None] * (len(found) - len(claimed)), (
            f"nonces recovered out of claim order: {[one is not None for one in found]}")
        self._check_settled(settled, {one.job_id for one in claimed})
        assert len(claimed) == min(count, len(eligible))
        for one, token in zip(claimed, tokens):
            self._took(one, eligible, worker, token)

    @precondition(lambda self: connection.vendor == "postgresql" and self.jobs
                  and all(j.lapsed is None for j in self.jobs.values()))
    @rule(worker=st.sampled_from(WORKERS), count=st.integers(1, 3))
    def claim_while_an_operator_locks_the_settings_row(self, worker, count):
        """An operator's open transaction holds the queue's settings row: the claim does not
        wait for it; the queue is held back for this round (issue 26). No lapsed lease in
        the model, so that no reaping is predicted either."""
        other = self._operator()
        try:
            other.execute("SELECT queue FROM soniq_queue_settings WHERE queue = %s FOR UPDATE",
                          (QUEUE,))
            with must_not_raise("claim_many_owned while the settings row is locked"):
                claimed = self.source.claim_many_owned(
                    worker, claim_tokens=[nonce() for _ in range(count)], lock_wait=5.0)
        finally:
            other.rollback()
        assert claimed == [], (
            f"a claim took {len(claimed)} job(s) of a queue whose settings row another "
            "transaction held")

    @precondition(lambda self: connection.vendor == "postgresql"
                  and any(self.is_live(f) for f in self.fences.values()))
    @rule(data=st.data(), write=st.sampled_from(("complete", "fail", "heartbeat")))
    def write_meets_a_row_lock(self, data, write):
        """Another transaction holds the job's row: the write's lock_wait runs out, it raises
        QUEUE_PERSISTENCE_FAILED (lock_not_available) and writes nothing."""
        live = sorted(label for label, f in self.fences.items() if self.is_live(f))
        fence = self.fences[data.draw(st.sampled_from(live), label="fence")]
        job = self._job_of(fence)
        calls = {
            "complete": lambda: self.source.complete_owned(fence, {"ok": True},
                                                           lock_wait=LOCK_WAIT),
            "fail": lambda: self.source.fail_owned(fence, "boom", retry=True, retry_delay=0,
                                                   lock_wait=LOCK_WAIT),
            "heartbeat": lambda: self.source.heartbeat_owned(fence, lock_wait=LOCK_WAIT),
        }
        other = self._operator()
        try:
            other.execute("SELECT id FROM soniq_jobs WHERE id = %s FOR UPDATE", (job.id,))
            try:
                got = calls[write]()
            except SoniqError as error:
                assert (error.code, error.reason) == (
                    ErrorCode.QUEUE_PERSISTENCE_FAILED, "lock_not_available"), (
                    f"{write} of {job.describe()} past its lock_wait raised "
                    f"{error.code.value} ({error.reason!r})")
            else:
                raise AssertionError(f"{write} of {job.describe()} returned {got!r} while "
                                     "another transaction held its row")
        finally:
            other.rollback()

    # Fenced writes ----------------------------------------------------

    def _draw_fence(self, data) -> QueueClaimFence:
        """Any fence ever issued; a live one more often than not."""
        live = sorted(label for label, f in self.fences.items() if self.is_live(f))
        pool = live if live and data.draw(st.booleans(), label="live") else sorted(self.fences)
        return self.fences[data.draw(st.sampled_from(pool), label="fence")]

    def _fence_call(self, what: str, fence: QueueClaimFence, call, expected: bool) -> bool:
        job = self._job_of(fence)
        live = self.is_live(fence)
        with must_not_raise(f"{what} of {job.describe()}"):
            got = call()
        if not live:
            assert got is False, (
                f"{what} with a stale fence (generation {fence.generation}, live "
                f"{None if job.fence is None else job.fence.generation}, lapsed "
                f"{job.lapsed is not None}) of {job.describe()} returned {got!r}")
        assert got is expected, f"{what} of {job.describe()}: expected {expected}, got {got!r}"
        return got

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def complete(self, data):
        fence = self._draw_fence(data)
        job = self._job_of(fence)
        expected = self.is_live(fence) and not job.cancel_requested
        if self._fence_call("complete_owned", fence,
                            lambda: self.source.complete_owned(fence, {"ok": True}), expected):
            job.status, job.fence = "done", None

    @precondition(lambda self: self.fences)
    @rule(data=st.data(), retry=st.booleans())
    def fail(self, data, retry):
        self._fail(self._draw_fence(data), retry)

    def _fail(self, fence: QueueClaimFence, retry: bool) -> None:
        job = self._job_of(fence)
        expected = self.is_live(fence) and not job.cancel_requested
        twins = self.twins(job)
        retried = retry and job.attempts < self.limit(job)
        what = (f"fail_owned(retry={retry})" + (
            f" [retry while queued twin(s) {[self.jobs[t].name for t in twins]} hold the slot]"
            if retried and twins and expected else ""))
        call = lambda: self.source.fail_owned(  # noqa: E731
            fence, "boom", retry=retry, retry_delay=0,
            default_max_attempts=self.default_attempts(job.job_name))
        if not self._fence_call(what, fence, call, expected):
            return
        if retried:
            self.requeue(job)
            if job.status == "cancelled":
                row = Job.objects.get(id=job.id)
                assert row.status == "cancelled", (
                    f"{job.describe()} retried while a queued twin held its slot: expected it "
                    f"cancelled (superseded), found {row.status}")
        else:
            self.to_dead_letter(job, "max_retries_exceeded" if retry else "permanent_failure")

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def defer(self, data):
        """A worker gives its claim back (no handler for the name here): no attempt spent."""
        fence = self._draw_fence(data)
        job = self._job_of(fence)
        expected = self.is_live(fence) and not job.cancel_requested
        twins = self.twins(job)
        what = "defer_owned" + (
            f" [while queued twin(s) {[self.jobs[t].name for t in twins]} hold the slot]"
            if twins and expected else "")
        call = lambda: self.source.defer_owned(fence, "not here", delay=0)  # noqa: E731
        if not self._fence_call(what, fence, call, expected):
            return
        job.attempts = max(job.attempts - 1, 0)
        self.requeue(job)

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def heartbeat(self, data):
        fence = self._draw_fence(data)
        self._fence_call("heartbeat_owned", fence, lambda: self.source.heartbeat_owned(fence),
                         self.is_live(fence))

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def acknowledge_cancel(self, data):
        fence = self._draw_fence(data)
        job = self._job_of(fence)
        expected = self.is_live(fence) and job.cancel_requested
        if self._fence_call("acknowledge_cancel_owned", fence,
                            lambda: self.source.acknowledge_cancel_owned(fence), expected):
            job.status, job.fence = "cancelled", None

    @precondition(lambda self: self.fences)
    @rule(data=st.data(), pid=st.integers(1, 99999))
    def set_pid(self, data, pid):
        fence = self._draw_fence(data)
        expected = self.is_live(fence) and not self._job_of(fence).cancel_requested
        self._fence_call("set_pid_owned", fence, lambda: self.source.set_pid_owned(fence, pid),
                         expected)

    @precondition(lambda self: self.fences)
    @rule(data=st.data())
    def recover(self, data):
        """A worker unsure whether its claim committed asks for it by worker id and nonce."""
        fence = self._draw_fence(data)
        job = self._job_of(fence)
        with must_not_raise(f"recover_owned_claim of {job.describe()}"):
            got = self.source.recover_owned_claim(fence.worker_id, claim_token=fence.claim_token)
        if self.is_live(fence):
            assert got is not None and got.claim_fence == fence, (
                f"recover_owned_claim did not find the live claim of {job.describe()}")
        else:
            assert got is None, (
                f"recover_owned_claim returned a stale claim (generation {fence.generation}) "
                f"of {job.describe()}")

    def _processing(self) -> list[ModelJob]:
        return [j for j in self.jobs.values() if j.status == "processing" and j.lapsed is None]

    @precondition(lambda self: self._processing())
    @rule(data=st.data())
    def lapse(self, data):
        """The worker stops heartbeating: its lease is now in the past."""
        self._lapse(self._draw_job(data, self._processing()))

    def _lapse(self, job: ModelJob) -> None:
        self.lapses += 1
        # Distinct instants, so the reaper's order (oldest lease first) is the model's.
        rewrite(job.id, lease_expires_at=self.past + dt.timedelta(seconds=self.lapses))
        job.lapsed = self.lapses

    @precondition(lambda self: self._processing())
    @rule(data=st.data(), worker=st.sampled_from(WORKERS))
    def poison(self, data, worker):
        """A job that kills every worker running it: its lease lapses and a worker claims,
        again and again while that claim takes the job back (its attempts run out, or
        another job comes first, or it is superseded or cancelled)."""
        job = self._draw_job(data, self._processing())
        for _ in range(self.limit(job) + 1):
            self._lapse(job)
            self.claim_many(worker, 3)
            if job.status != "processing" or job.lapsed is not None:
                break

    # Administration ---------------------------------------------------

    @precondition(lambda self: self.jobs)
    @rule(data=st.data())
    def request_cancel(self, data):
        job = self._draw_job(data, self.jobs.values())
        expected = job.status in ("queued", "processing")
        with must_not_raise(f"request_cancel of {job.describe()}"):
            got = self.source.request_cancel(job.id)
        assert got is expected, f"request_cancel of {job.describe()} returned {got!r}"
        if job.status == "queued":
            job.status = "cancelled"
        elif job.status == "processing":
            job.cancel_requested = True
            if job.lapsed is not None:
                # No live worker is left to see the request: cancelling at once is
                # as good as the request the next reap turns into a cancel.
                if Job.objects.get(id=job.id).status == "cancelled":
                    job.status, job.fence, job.lapsed = "cancelled", None, None

    @rule()
    def request_cancel_unknown(self):
        with must_not_raise("request_cancel of an unknown id"):
            got = self.source.request_cancel(uuid.uuid4())
        assert got is False, f"request_cancel of an unknown id returned {got!r}"

    def _dead_letters(self) -> list[ModelJob]:
        return [j for j in self.jobs.values() if j.dead is not None]

    @precondition(lambda self: self._dead_letters())
    @rule(data=st.data())
    def replay_dead_letter(self, data):
        job = self._draw_job(data, self._dead_letters())
        if job.status is not None:
            expected = "live"
        elif job.dead.replayed:
            expected = "already_replayed"
        else:
            expected = "replayed"
        with must_not_raise(f"replay of {job.describe()}"):
            report = replay_dead_letters(ids=[job.id])
        outcomes = [name for name in ("replayed", "live", "already_replayed", "missing",
                                      "conflicts") if job.id in getattr(report, name)]
        assert outcomes == [expected], f"replay of {job.describe()}: {outcomes}, not {expected}"
        if expected == "replayed":
            job.dead.resurrections += 1
            job.dead.replayed = True
            job.status, job.attempts = "queued", 0
            job.generation = job.dead.resurrections * GENERATION_STRIDE
            job.unique, job.dedup_key, job.active_key = False, None, None
            job.cancel_requested, job.superseded_by = False, frozenset()

    @precondition(lambda self: len(self.registry) < len(NAMES))
    @rule(data=st.data(), max_attempts=st.sampled_from((1, 2, 3)))
    def register_handler(self, data, max_attempts):
        """A worker registers a handler for a name: its max_attempts is the name's default."""
        unregistered = [name for name in NAMES if name not in self.registry]
        job_name = data.draw(st.sampled_from(unregistered), label="job_name")
        TaskRegistration.objects.create(task_name=job_name, worker_id="stateful-worker",
                                        queue="default", max_attempts=max_attempts)
        self.registry[job_name] = max_attempts

    # Invariants -------------------------------------------------------

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def a_run_ends(self, data):
        """A handler returns and its worker forgets the run -- that run only.

        The same worker may meanwhile have claimed the job again (the first
        run's lease lapsed while its handler ran on): the second run must
        keep its flight, or it loses its heartbeats and the job runs a third time.
        """
        label = data.draw(st.sampled_from(sorted(self.runs)), label="run")
        run = self.runs.pop(label)
        self.flights[run.claimed.claim_fence.worker_id].finish(run)

    @invariant()
    def every_open_run_keeps_its_flight(self):
        for label, run in self.runs.items():
            held = self.flights[run.claimed.claim_fence.worker_id].all()
            assert any(flight is run for flight in held), (
                f"the run {label} lost its flight in worker "
                f"{run.claimed.claim_fence.worker_id}'s registry (another claim of the same "
                f"job replaced or removed it)")

    @invariant()
    def database_matches_the_model(self):
        now = timezone.now()
        rows = {row.id: row for row in Job.objects.all()}
        dead = {row.id: row for row in DeadLetterJob.objects.all()}
        names = {j.id: j.name for j in self.jobs.values()}
        unknown = [r for r in list(rows) + list(dead) if r not in self.jobs]
        assert not unknown, f"rows the model does not know: {unknown}"
        for job in self.jobs.values():
            assert job.id in rows or job.id in dead, f"{job.describe()} was lost"
            if job.status is None:
                assert job.id not in rows, (
                    f"{job.describe()} should be only a dead letter but is in soniq_jobs as "
                    f"{rows[job.id].status}")
            else:
                row = rows.get(job.id)
                assert row is not None, (
                    f"{job.describe()} should be in soniq_jobs, found dead letter "
                    f"{dead[job.id].dead_letter_reason}")
                self._check_row(job, row, now, names)
            if job.dead is not None:
                letter = dead.get(job.id)
                assert letter is not None, f"{job.describe()} lost its dead letter"
                assert (letter.dead_letter_reason, letter.resurrection_count) == (
                    job.dead.reason, job.dead.resurrections), (
                    f"{job.describe()}: dead letter {letter.dead_letter_reason} "
                    f"x{letter.resurrection_count}, expected {job.dead}")
                assert letter.submission_id == job.submission_id, (
                    f"the dead letter of {job.describe()} carries submission "
                    f"{letter.submission_id!r}, not {job.submission_id!r}")
            else:
                assert job.id not in dead, f"{job.describe()} has an unexpected dead letter"
        # Submission identities never change, in either table.
        for row in list(rows.values()) + list(dead.values()):
            identity = (row.submission_id, row.submission_fingerprint)
            if isinstance(row, DeadLetterJob):
                first = self.dead_identity.setdefault(row.id, identity)
                assert first == identity, (
                    f"the dead letter of {names[row.id]} changed its submission identity "
                    f"from {first[0]!r} to {identity[0]!r}")
            if row.submission_id is not None:
                first = self.fingerprints.setdefault(row.submission_id,
                                                     row.submission_fingerprint)
                assert first == row.submission_fingerprint, (
                    f"submission {row.submission_id!r} changed its fingerprint")
        for submission_id, (_, first_id) in self.submitted.items():
            holders = {r.id for r in list(rows.values()) + list(dead.values())
                       if r.submission_id == submission_id}
            assert holders == {first_id}, (
                f"submission {submission_id!r} no longer names only its first job "
                f"{names[first_id]}: {[names.get(h, h) for h in holders]}")

    def _check_row(self, job: ModelJob, row: Job, now, names) -> None:
        assert row.status == job.status, (
            f"{job.describe()}: soniq_jobs says {row.status}")
        assert row.attempts == job.attempts, f"{job.describe()}: attempts {row.attempts}"
        assert row.claim_generation == job.generation, (
            f"{job.describe()}: generation {row.claim_generation}, expected {job.generation}")
        assert row.submission_id == job.submission_id
        assert row.fence_required is (job.submission_id is not None)
        # Terminal, or a way back to runnable.
        if row.status == "queued":
            assert row.scheduled_at is None or row.scheduled_at <= now, (
                f"{job.describe()} is queued but not due")
        elif row.status == "processing":
            fence = job.fence
            assert (row.claim_owner, row.claim_token) == (fence.worker_id, fence.claim_token), (
                f"{job.describe()} is held by another claim than the model's")
            assert row.lease_expires_at is not None, (
                f"{job.describe()} is processing without a lease: it can never be reaped")
            assert (row.lease_expires_at > now) is (job.lapsed is None)
            assert row.cancel_requested is job.cancel_requested
        else:
            assert row.status in ("done", "cancelled")
        if job.superseded_by:
            twins = [names[t] for t in job.superseded_by]
            assert row.last_error is not None and row.last_error.startswith("superseded"), (
                f"{job.describe()} was superseded by {twins} but last_error is "
                f"{row.last_error!r}")
            assert any(str(t) in row.last_error for t in job.superseded_by), (
                f"{job.describe()}: last_error {row.last_error!r} does not name {twins}")

    @invariant()
    def changed_jobs_are_readable_and_fenced(self):
        """For every job whose state changed in this step: get_job finds it as the model
        says, and of the fences ever issued for it only the live one owns it.

        (The row itself is compared on every step above; a job that did not change
        keeps what was checked here, and a stale fence stays stale.)
        """
        for job in self.jobs.values():
            signature = (job.status, job.generation, job.fence, job.lapsed,
                         job.cancel_requested, None if job.dead is None else (
                             job.dead.reason, job.dead.resurrections, job.dead.replayed))
            if self.checked.get(job.id) == signature:
                continue
            self.checked[job.id] = signature
            with must_not_raise(f"get_job of {job.describe()}"):
                info = get_job(job.id)
            expected = job.status if job.status is not None else "dead_letter"
            assert info is not None, (
                f"get_job cannot find {job.describe()} (RESULT_TTL is a day)")
            assert info.status == expected, f"get_job of {job.describe()} says {info.status}"
            if job.status is None:
                # Its id is taken while only its dead letter holds it (a replay brings
                # the job back under that id).
                expect_error(ErrorCode.DUPLICATE_JOB_ID,
                             f"enqueue(job_id=<id of {job.name}, only in soniq_dead_letter_jobs>)",
                             lambda: enqueue(job.job_name, job.args, job_id=job.id))
                self._submit(JobRequest(job.job_name, job.args, job_id=job.id),
                             f"dead-{next(self.counter)}", False)
            live = 0
            for label, fence in self.fences.items():
                if fence.job_id != str(job.id):
                    continue
                with must_not_raise(f"get_owned_state of {label}"):
                    state = self.source.get_owned_state(fence)
                if self.is_live(fence):
                    live += 1
                    assert state is not None, (
                        f"the live fence {label} of {job.describe()} is refused")
                    assert state.cancel_requested is job.cancel_requested
                else:
                    assert state is None, (
                        f"the stale fence {label} of {job.describe()} still owns it")
            assert live <= 1


@pytest.mark.version_independent  # a long stateful run of the protocol: Django 5.2 passes only
def test_owned_protocol_state_machine():
    with override_settings(SONIQ=SONIQ):
        run_state_machine_as_test(OwnedProtocol, settings=SETTINGS)
