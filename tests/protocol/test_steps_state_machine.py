"""Durable steps against a model, one random operation at a time.

A hypothesis ``RuleBasedStateMachine`` drives the real API: jobs of three
steps (each atomic or not, drawn per job) are claimed (``OwnedJobSource``),
their runs take their next step (``JobContext.step``, whose function writes
one ``Effect`` row), sometimes crash inside a step (the function raises after
its write), lose their claim (the lease lapses; the next claim is a new run
of the job), lose it while a step's function runs (PostgreSQL: another
connection lapses the lease mid-step, as a worker stopped past its lease
finds), are asked to cancel, complete, and stale runs keep calling ``step``.
The model says what each call must do -- return a recorded result without
calling the function, run it and record it, or refuse -- and, checked after
every operation:

- the effect of an atomic step is committed at most once, and exactly once
  when the step is recorded; once the job is done, every step is recorded
  and every atomic step's effect is there exactly once;
- a plain step's effects are exactly the calls the model expects (at least
  once: a crash between its function and its record runs it again);
- a step is recorded only by a run whose claim held (the record's
  generation is a live run's), never twice, and no step's function is called
  after its record committed;
- the database's records are the model's: names, generations, results.

``test_the_model_finds_a_record_without_its_fence`` re-installs
``soniq_record_step`` without its fence check (a lapsed run may record) and
shows the model finds it. Sizes: ``SONIQ_STATEFUL_EXAMPLES`` /
``SONIQ_STATEFUL_STEPS`` (defaults 20 x 30 here).
"""

import datetime as dt
import threading
import uuid
from dataclasses import dataclass, field

import pytest
from django.db import connection, connections
from django.test import override_settings
from django.utils import timezone
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.errors import Flaky
from hypothesis.stateful import (RuleBasedStateMachine, invariant, precondition, rule,
                                 run_state_machine_as_test)

from soniq_django import enqueue, job
from soniq_django.errors import JobCancelled, StepNotRecorded
from soniq_django.models import Job, JobStep
from soniq_django.owned import OwnedJobSource
from soniq_django.worker.context import JobContext, _current, bind
from tests.support.owned import nonce, rewrite
from tests.support.stateful import (empty_tables, failure_text, install_function,
                                    stateful_settings)
from tests.testapp.models import Effect

pytestmark = pytest.mark.django_db(transaction=True)

SETTINGS = stateful_settings(20, 30)
# No lease lapses and nothing expires unless a rule says so.
SONIQ = {"RESULT_TTL": 86400, "LEASE_SECONDS": 3600, "RETRY_BASE_SECONDS": 0}
NAMES = ("s0", "s1", "s2")


@job(name="stm.steps", retries=200)
def stm_steps() -> None:
    return None


class Crash(Exception):
    """A step's function failing after its write (a crash inside the step)."""


@dataclass
class ModelJob:
    label: str
    atomic: tuple[bool, ...]
    state: str = "queued"  # queued, processing, done, cancelled
    live: int | None = None  # the generation of the run whose claim holds
    cancel: bool = False
    recorded: dict[str, int] = field(default_factory=dict)  # name -> generation
    effects: dict[str, int] = field(default_factory=dict)  # committed effects, by step


@dataclass
class Run:
    job_id: uuid.UUID
    context: JobContext
    next: int = 0  # the index of its next step
    over: bool = False  # it raised: the handler stopped


def _lapse(job_id: uuid.UUID) -> None:
    rewrite(job_id, lease_expires_at=timezone.now() - dt.timedelta(seconds=1))


def _lapse_elsewhere(job_id: uuid.UUID) -> None:
    """Lapse the lease from another connection (a thread of its own), now."""
    def body() -> None:
        try:
            _lapse(job_id)
        finally:
            connections.close_all()

    thread = threading.Thread(target=body)
    thread.start()
    thread.join(10)


class Steps(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        empty_tables(JobStep, Effect)
        self.source = OwnedJobSource()
        self.jobs: dict[uuid.UUID, ModelJob] = {}
        self.runs: list[Run] = []
        self.calls: list[tuple[uuid.UUID, str, int]] = []  # (job, step, generation) called

    # Helpers -----------------------------------------------------------

    def _effect(self, run: Run, name: str, *, crash: bool = False, lapse: bool = False):
        def fn() -> dict:
            context = run.context
            self.calls.append((run.job_id, name, context.generation))
            Effect.objects.create(job_id=run.job_id, generation=context.generation,
                                  attempt=context.attempts, pid=0, note=name)
            if lapse:
                _lapse_elsewhere(run.job_id)
            if crash:
                raise Crash(name)
            return {"step": name, "gen": context.generation}
        return fn

    def _claimable(self) -> bool:
        return any(m.state == "queued" or (m.state == "processing" and m.live is None)
                   for m in self.jobs.values())

    # Rules -------------------------------------------------------------

    @precondition(lambda self: sum(m.state not in ("done", "cancelled")
                                   for m in self.jobs.values()) < 3)
    @rule(atomic=st.tuples(st.booleans(), st.booleans(), st.booleans()))
    def enqueue_job(self, atomic):
        job_id = uuid.UUID(str(enqueue("stm.steps", {}, max_attempts=1000)))
        self.jobs[job_id] = ModelJob(label=f"job{len(self.jobs)}", atomic=atomic)

    @precondition(lambda self: self._claimable())
    @rule()
    def claim(self):
        claimed = self.source.claim_next_owned("stm-worker", claim_token=nonce())
        assert claimed is not None, "a claimable job was not claimed"
        job_id = uuid.UUID(str(claimed.job_id))
        model = self.jobs[job_id]
        assert model.state == "queued" or (model.state == "processing" and model.live is None)
        fence = claimed.claim_fence
        context = JobContext(job_id=fence.job_id, job_name=claimed.job_name,
                             queue=claimed.queue, attempts=claimed.attempts,
                             max_attempts=claimed.max_attempts, generation=fence.generation,
                             _fence=fence, _using="default")
        model.state, model.live, model.cancel = "processing", fence.generation, False
        self.runs.append(Run(job_id, context))

    @precondition(lambda self: any(not r.over and r.next < len(NAMES) for r in self.runs))
    @rule(data=st.data(), fault=st.sampled_from(["none", "none", "crash", "lapse"]))
    def step(self, data, fault):
        run = data.draw(st.sampled_from([r for r in self.runs
                                         if not r.over and r.next < len(NAMES)]))
        model = self.jobs[run.job_id]
        if fault == "lapse" and (connection.vendor != "postgresql" or model.cancel):
            # SQLite: the step's transaction holds the write lock, no one can lapse the lease
            # meanwhile (decision 0046); a cancelled job's run is only asked to stop.
            fault = "none"
        index, gen = run.next, run.context.generation
        name, atomic = NAMES[index], model.atomic[index]
        held = model.live == gen and model.state == "processing"
        before = len(self.calls)
        fn = self._effect(run, name, crash=fault == "crash", lapse=fault == "lapse")
        token = bind(run.context)
        try:
            got = run.context.step(name, fn, atomic=atomic)
            raised = None
        except (Crash, StepNotRecorded, JobCancelled) as error:
            got, raised = None, error
        finally:
            _current.reset(token)
        called = len(self.calls) > before
        run.next += 1
        if not held:  # a stale run: looked up first, refused, nothing called
            assert isinstance(raised, StepNotRecorded), (model.label, name, raised)
            assert not called, f"{model.label}.{name}: a lapsed run called a step's function"
            run.over = True
            return
        if name in model.recorded:  # recorded by an earlier run: returned, not called
            assert not called and raised is None
            assert got == {"step": name, "gen": model.recorded[name]}
            return
        assert called, f"{model.label}.{name}: a step not recorded was not run"
        if fault == "crash":
            assert isinstance(raised, Crash)
            if not atomic:
                model.effects[name] = model.effects.get(name, 0) + 1
            run.over = True
            return
        if fault == "lapse":  # the claim went while the function ran: refused at the record
            assert isinstance(raised, StepNotRecorded), (
                f"{model.label}.{name}: recorded by a run whose claim lapsed during the step "
                f"({raised!r})")
            if not atomic:
                model.effects[name] = model.effects.get(name, 0) + 1
            model.live = None
            run.over = True
            return
        if model.cancel:
            assert isinstance(raised, JobCancelled), (model.label, name, raised)
            if not atomic:
                model.effects[name] = model.effects.get(name, 0) + 1
            run.over = True
            return
        assert raised is None, (model.label, name, raised)
        assert got == {"step": name, "gen": gen}
        model.recorded[name] = gen
        model.effects[name] = model.effects.get(name, 0) + 1

    @precondition(lambda self: any(m.live is not None and not m.cancel
                                   for m in self.jobs.values()))
    @rule(data=st.data())
    def lapse(self, data):
        job_id = data.draw(st.sampled_from([j for j, m in self.jobs.items()
                                            if m.live is not None and not m.cancel]))
        _lapse(job_id)
        self.jobs[job_id].live = None

    @precondition(lambda self: any(m.live is not None and not m.cancel
                                   for m in self.jobs.values()))
    @rule(data=st.data())
    def request_cancel(self, data):
        job_id = data.draw(st.sampled_from([j for j, m in self.jobs.items()
                                            if m.live is not None and not m.cancel]))
        assert self.source.request_cancel(job_id) is True
        self.jobs[job_id].cancel = True
        for run in self.runs:  # the heartbeat tells the live run only
            if run.job_id == job_id and run.context.generation == self.jobs[job_id].live:
                run.context._cancel().set()

    @precondition(lambda self: any(m.cancel and m.live is not None for m in self.jobs.values()))
    @rule(data=st.data())
    def acknowledge_cancel(self, data):
        """The worker acknowledges a cancel its live run stopped for (or will)."""
        job_id = data.draw(st.sampled_from([j for j, m in self.jobs.items()
                                            if m.cancel and m.live is not None]))
        model = self.jobs[job_id]
        (run,) = [r for r in self.runs
                  if r.job_id == job_id and r.context.generation == model.live]
        assert self.source.acknowledge_cancel_owned(run.context._fence) is True
        model.state, model.live, run.over = "cancelled", None, True

    @precondition(lambda self: any(not r.over and r.next == len(NAMES) for r in self.runs))
    @rule(data=st.data())
    def finish(self, data):
        run = data.draw(st.sampled_from([r for r in self.runs
                                         if not r.over and r.next == len(NAMES)]))
        model = self.jobs[run.job_id]
        fence = run.context._fence
        held = model.live == fence.generation and model.state == "processing"
        if model.cancel and held:
            assert self.source.acknowledge_cancel_owned(fence) is True
            model.state, model.live = "cancelled", None
        else:
            assert self.source.complete_owned(fence) is held
            if held:
                model.state, model.live = "done", None
        run.over = True

    # Invariants --------------------------------------------------------

    @invariant()
    def records_are_the_models(self):
        rows = {(r.job_id, r.name): (r.generation, r.result)
                for r in JobStep.objects.all()}
        expected = {(j, n): (g, {"step": n, "gen": g})
                    for j, m in self.jobs.items() for n, g in m.recorded.items()}
        assert rows == expected, "the recorded steps are not the model's"

    @invariant()
    def effects_land_as_the_model_says(self):
        counts: dict[tuple[uuid.UUID, str], int] = {}
        for job_id, note in Effect.objects.values_list("job_id", "note"):
            counts[(job_id, note)] = counts.get((job_id, note), 0) + 1
        for job_id, model in self.jobs.items():
            for index, name in enumerate(NAMES):
                found = counts.get((job_id, name), 0)
                assert found == model.effects.get(name, 0), (model.label, name, found)
                if model.atomic[index]:
                    assert found <= 1, f"{model.label}.{name}: an atomic effect landed twice"
                    assert found == (name in model.recorded), (model.label, name)
                if model.state == "done":
                    assert name in model.recorded, f"{model.label} done without {name}"
                    if model.atomic[index]:
                        assert found == 1, f"{model.label}.{name}: not exactly once"

    @invariant()
    def no_function_runs_after_its_record(self):
        for job_id, model in self.jobs.items():
            for name, gen in model.recorded.items():
                runs = [g for j, n, g in self.calls if j == job_id and n == name]
                assert runs and runs[-1] == gen, (
                    f"{model.label}.{name}: called after its record committed")

    @invariant()
    def job_states_are_the_models(self):
        for job_id, model in self.jobs.items():
            status = Job.objects.filter(id=job_id).values_list("status", flat=True).first()
            if model.state == "processing" and model.live is None:  # lapsed: maybe reaped
                assert status in ("processing", "queued"), (model.label, status)
            else:
                assert status == model.state, (model.label, status, model.state)


@pytest.mark.version_independent  # a long stateful run: Django 5.2 passes only
def test_steps_state_machine():
    with override_settings(SONIQ=SONIQ):
        run_state_machine_as_test(Steps, settings=SETTINGS)


# A record without its fence, re-introduced ---------------------------------

FENCE_CHECK = """    IF v_now IS NULL THEN
        RETURN false;
    END IF;
    -- The row is locked by this transaction"""
NO_FENCE = """    v_now := pg_catalog.clock_timestamp();  -- the fence's answer ignored
    -- The row is locked by this transaction"""


@pytest.mark.version_independent
@pytest.mark.postgresql_only
def test_the_model_finds_a_record_without_its_fence():
    from soniq_django.sql import released_function

    released = released_function("steps_v1.sql", "soniq_record_step")
    assert FENCE_CHECK in released
    install_function(released.replace(FENCE_CHECK, NO_FENCE))
    try:
        broken = settings(SETTINGS, max_examples=200, phases=[Phase.generate], database=None,
                          print_blob=False)
        with override_settings(SONIQ=SONIQ), pytest.raises((AssertionError, Flaky)) as found:
            run_state_machine_as_test(Steps, settings=broken)
    finally:
        install_function(released)
    message = failure_text(found.value)
    assert "recorded by a run whose claim lapsed during the step" in message, message
