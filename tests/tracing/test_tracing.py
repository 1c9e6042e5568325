"""Tracing through the queue: the enqueue's context travels with the job to its handler's span.

A real OpenTelemetry SDK with an in-memory exporter (conftest.py), real
workers against committed rows, both databases. Each test asserts the ids:
the producer span is the enqueuing span's child, the job's row in
soniq_job_trace holds the producer span's context, and the handler's span
starts a trace of its own linked to it (decision 0041).
"""

import datetime as dt

import pytest
from asgiref.sync import async_to_sync
from django.db import transaction
from django.utils import timezone
from opentelemetry import trace
from opentelemetry.trace import SpanKind, StatusCode

from soniq_django import aenqueue, bulk_enqueue, enqueue
from soniq_django.housekeeping import purge_dead_letters, purge_expired
from soniq_django.models import DeadLetterJob, Job, JobTrace
from soniq_django.producer import _copy
from soniq_django.producer.request import JobRequest
from soniq_django.replay import replay_dead_letters
from soniq_django.testing import run_jobs
from tests.support.workers import run_burst
from tests.tracing.handlers import seen, traced_ok

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("fast")]

BOTH_PATHS = pytest.mark.parametrize("concurrency", [1, 3])

def _carried(job_id):
    row = JobTrace.objects.get(job_id=job_id)
    version, trace_id, span_id, flags = row.traceparent.split("-")
    assert version == "00"
    return int(trace_id, 16), int(span_id, 16), int(flags, 16) & 1  # 1: sampled


def _assert_linked(process, producer) -> None:
    """``process`` starts a trace of its own, linked to ``producer``'s span."""
    assert process.kind is SpanKind.CONSUMER
    assert process.parent is None
    assert process.context.trace_id != producer.context.trace_id
    (link,) = process.links
    assert (link.context.trace_id, link.context.span_id) == (
        producer.context.trace_id, producer.context.span_id)


@BOTH_PATHS
def test_the_enqueue_context_travels_with_the_job_to_a_linked_handler_span(spans, concurrency):
    with spans.tracer.start_as_current_span("request") as request:
        job_id = enqueue("tracing.ok", {"n": 3}, queue="traced")
    producer = spans.one("soniq enqueue tracing.ok")
    assert producer.kind is SpanKind.PRODUCER
    assert producer.parent.span_id == request.get_span_context().span_id
    assert producer.context.trace_id == request.get_span_context().trace_id
    assert producer.attributes["messaging.message.id"] == str(job_id)
    assert producer.attributes["messaging.destination.name"] == "traced"
    assert _carried(job_id) == (producer.context.trace_id, producer.context.span_id, 1)

    assert run_burst(concurrency=concurrency, queues=["traced"]) == 0
    process = spans.one("soniq process tracing.ok")
    _assert_linked(process, producer)
    assert dict(process.attributes) == {
        "messaging.system": "soniq", "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": "traced",
        "messaging.message.id": str(job_id), "soniq.job.name": "tracing.ok",
        "soniq.job.attempt": 1, "soniq.job.outcome": "done"}
    assert process.status.status_code is StatusCode.UNSET
    # The handler ran inside it: its own spans are the run's children.
    assert seen["tracing.ok"] == (process.context.trace_id, process.context.span_id)
    inside = spans.one("inside tracing.ok")
    assert inside.parent.span_id == process.context.span_id


@BOTH_PATHS
def test_an_async_handler_runs_inside_its_span(spans, concurrency):
    with spans.tracer.start_as_current_span("request"):
        job_id = enqueue("tracing.async_ok", {"n": 1})
    assert run_burst(concurrency=concurrency) == 0
    process = spans.one("soniq process tracing.async_ok")
    _assert_linked(process, spans.one("soniq enqueue tracing.async_ok"))
    assert process.attributes["messaging.message.id"] == str(job_id)
    assert seen["tracing.async_ok"] == (process.context.trace_id, process.context.span_id)


def test_a_failure_is_recorded_on_the_span_and_the_last_one_names_the_dead_letter(spans):
    with spans.tracer.start_as_current_span("request"):
        job_id = enqueue("tracing.fails", max_attempts=2)
    assert run_burst() == 0
    assert DeadLetterJob.objects.filter(id=job_id).exists()
    producer = spans.one("soniq enqueue tracing.fails")
    first, second = sorted(spans.named("soniq process tracing.fails"),
                           key=lambda span: span.attributes["soniq.job.attempt"])
    for span in (first, second):
        _assert_linked(span, producer)  # every attempt links to the one enqueue
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError"
        (event,) = span.events
        assert event.name == "exception"
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "tracing boom"
    assert (first.attributes["soniq.job.attempt"], first.attributes["soniq.job.outcome"]) == (
        1, "retry")
    assert "soniq.dead_letter_reason" not in first.attributes
    assert (second.attributes["soniq.job.attempt"], second.attributes["soniq.job.outcome"],
            second.attributes["soniq.dead_letter_reason"]) == (2, "dead", "max_retries_exceeded")


def test_args_that_do_not_fit_make_a_failed_span_with_their_reason(spans):
    with spans.tracer.start_as_current_span("request"):
        enqueue("tracing.ok", {"nope": 1})
    assert run_burst() == 0
    process = spans.one("soniq process tracing.ok")
    assert process.attributes["soniq.dead_letter_reason"] == "invalid_arguments"
    assert process.status.status_code is StatusCode.ERROR


def test_bulk_enqueue_carries_one_producer_span_to_every_job(spans):
    with spans.tracer.start_as_current_span("request"):
        ids = bulk_enqueue([JobRequest("tracing.ok", {"n": n}) for n in range(3)]
                           + [JobRequest("tracing.ok", {"n": 9}, dedup_key="tracing-bulk")])
    producer = spans.one("soniq enqueue tracing.ok")
    assert producer.attributes["messaging.batch.message_count"] == 4
    assert {_carried(job_id) for job_id in ids} == {
        (producer.context.trace_id, producer.context.span_id, 1)}
    assert run_burst(concurrency=3) == 0
    processes = spans.named("soniq process tracing.ok")
    assert sorted(span.attributes["messaging.message.id"] for span in processes) == sorted(
        map(str, ids))
    for span in processes:
        _assert_linked(span, producer)


@pytest.mark.postgresql_only
def test_a_bulk_enqueue_loaded_with_copy_carries_the_context_too(spans, monkeypatch):
    monkeypatch.setattr(_copy, "COPY_MIN_JOBS", 2)
    used = []
    original = _copy.enqueue_many
    monkeypatch.setattr(_copy, "enqueue_many",
                        lambda *args: used.append(1) or original(*args))
    with spans.tracer.start_as_current_span("request"):
        ids = bulk_enqueue([JobRequest("tracing.ok", {"n": n}) for n in range(5)])
    assert used, "the COPY path was not taken"
    producer = spans.one("soniq enqueue tracing.ok")
    assert {_carried(job_id) for job_id in ids} == {
        (producer.context.trace_id, producer.context.span_id, 1)}


def test_enqueue_on_commit_carries_the_context_current_at_the_call(spans):
    with transaction.atomic():
        with spans.tracer.start_as_current_span("request") as request:
            job_id = traced_ok.enqueue_on_commit(n=2)
        assert not spans.named("soniq enqueue tracing.ok")  # nothing before the commit
    producer = spans.one("soniq enqueue tracing.ok")
    assert producer.parent.span_id == request.get_span_context().span_id
    assert _carried(job_id) == (producer.context.trace_id, producer.context.span_id, 1)
    run_jobs()
    _assert_linked(spans.one("soniq process tracing.ok"), producer)


def test_the_django_tasks_backend_carries_the_context(spans):
    from soniq_django.tasks_backend import SoniqTaskBackend
    from tests.testapp.tasks import add

    for on_commit in (False, True):
        backend = SoniqTaskBackend("traced", {"OPTIONS": {"enqueue_on_commit": on_commit}})
        with transaction.atomic():
            with spans.tracer.start_as_current_span("request"):
                result = backend.enqueue(add, [1, 2], {})
        producer = spans.named("soniq enqueue tests.testapp.tasks.add")[-1]
        assert _carried(result.id) == (producer.context.trace_id, producer.context.span_id,
                                       1)


def test_aenqueue_carries_the_context_through_its_thread_hop(spans):
    async def produce():
        with spans.tracer.start_as_current_span("request"):
            return await aenqueue("tracing.ok", {"n": 4})

    job_id = async_to_sync(produce)()
    producer = spans.one("soniq enqueue tracing.ok")
    assert _carried(job_id) == (producer.context.trace_id, producer.context.span_id, 1)


def test_run_jobs_and_an_atomic_handler_run_inside_linked_spans(spans):
    with spans.tracer.start_as_current_span("request"):
        enqueue("tracing.atomic")
    (run,) = run_jobs()
    assert run.outcome == "done"
    process = spans.one("soniq process tracing.atomic")
    _assert_linked(process, spans.one("soniq enqueue tracing.atomic"))
    assert seen["tracing.atomic"] == (process.context.trace_id, process.context.span_id)


@pytest.mark.parametrize("options", [{"depends_on": "first"},
                                     {"concurrency_key": "tenant-1", "key_concurrency": 1}],
                         ids=["depends_on", "concurrency_key"])
def test_a_waiting_or_keyed_job_carries_the_context_too(spans, options):
    first = enqueue("tracing.ok", {"n": 1})
    if options.get("depends_on") == "first":
        options = {"depends_on": [first]}
    with spans.tracer.start_as_current_span("request"):
        job_id = enqueue("tracing.ok", {"n": 2}, **options)
    producer = spans.named("soniq enqueue tracing.ok")[-1]  # the second enqueue's
    assert producer.attributes["messaging.message.id"] == str(job_id)
    assert _carried(job_id) == (producer.context.trace_id, producer.context.span_id, 1)


def test_a_unique_job_keeps_the_context_of_its_first_enqueue(spans):
    with spans.tracer.start_as_current_span("first"):
        first = enqueue("tracing.ok", {"n": 1}, unique_job=True)
    with spans.tracer.start_as_current_span("second"):
        second = enqueue("tracing.ok", {"n": 1}, unique_job=True)
    assert first == second
    producers = spans.named("soniq enqueue tracing.ok")
    assert _carried(first)[:2] == (producers[0].context.trace_id, producers[0].context.span_id)


def test_an_unsampled_span_carries_nothing(spans):
    unsampled = trace.NonRecordingSpan(trace.SpanContext(
        trace_id=0x1234, span_id=0x5678, is_remote=True, trace_flags=trace.TraceFlags(0)))
    with trace.use_span(unsampled):
        job_id = enqueue("tracing.ok")
    assert not JobTrace.objects.filter(job_id=job_id).exists()
    assert not spans.named("soniq enqueue tracing.ok")
    run_jobs()
    assert spans.one("soniq process tracing.ok").links == ()


def test_a_remote_context_without_a_local_provider_is_carried_as_it_came(spans):
    # A context taken from an incoming request's headers, in a process whose
    # provider makes no span of its own: the job carries that context.
    remote = trace.NonRecordingSpan(trace.SpanContext(
        trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1)))
    with trace.use_span(remote):
        job_id = enqueue("tracing.ok")
    producer = spans.one("soniq enqueue tracing.ok")  # a provider is set here: a real span
    assert producer.parent.span_id == 0xDEF
    assert _carried(job_id) == (0xABC, producer.context.span_id, 1)


def test_the_context_goes_with_the_job_and_stays_with_its_dead_letter(spans):
    with spans.tracer.start_as_current_span("request"):
        done = enqueue("tracing.ok")
        dead = enqueue("tracing.fails", max_attempts=1)
    run_jobs(raise_exceptions=False)
    assert DeadLetterJob.objects.filter(id=dead).exists()
    assert set(JobTrace.objects.values_list("job_id", flat=True)) == {done, dead}
    # The finished job's row goes with its purge; the dead letter keeps its own.
    expires_at = Job.objects.get(id=done).expires_at
    assert purge_expired(now=expires_at + dt.timedelta(seconds=1)) == 1
    assert set(JobTrace.objects.values_list("job_id", flat=True)) == {dead}
    # A replay runs under a new claim, linked to the same enqueue.
    producer = spans.one("soniq enqueue tracing.fails")
    assert replay_dead_letters(ids=[dead]).replayed == (dead,)
    spans.clear()
    run_jobs(raise_exceptions=False)
    (again,) = spans.named("soniq process tracing.fails")
    _assert_linked(again, producer)
    # Once the job has left both tables, its row is gone.
    assert not Job.objects.filter(id=dead).exists()
    assert purge_dead_letters(older_than=dt.timedelta(0),
                              now=timezone.now() + dt.timedelta(hours=1)) == 1
    assert not JobTrace.objects.exists()
