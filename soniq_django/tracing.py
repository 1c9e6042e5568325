"""Tracing through the queue with OpenTelemetry (docs/tracing.md, decision 0041).

With the ``opentelemetry`` extra installed and a tracer provider configured:

- an enqueue made while a sampled span is current runs in a PRODUCER span
  ``soniq enqueue <job name>``, whose W3C context (``traceparent``,
  ``tracestate``) is written to ``soniq_job_trace`` in the enqueue's own
  statement or transaction (``producing``, ``keep``);
- the worker reads the contexts of the jobs a claim brought, in one query
  (``carriers``), and runs each handler in a CONSUMER span
  ``soniq process <job name>`` -- a new trace, *linked* to the enqueue's
  span -- with the job's id, name, queue and attempt as attributes and its
  outcome at the end (``job_span``, ``activate``, ``finish``).

Off and free otherwise. Nothing here imports OpenTelemetry: a span can only
be current once something in the process imported ``opentelemetry.trace``,
so ``sys.modules`` is asked first, and without it every function returns at
once (no statement, no column, no import). With the API imported but no
tracer provider set, the worker reads nothing and makes no span, and an
enqueue carries a context only if one was handed to it (a sampled span
from an incoming request's headers).
"""

import logging
import sys
import uuid
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

logger = logging.getLogger("soniq_django.tracing")

T = TypeVar("T")

#: A job's carried context: its W3C ``traceparent`` and ``tracestate`` (None: none was set).
Carrier = tuple[str, str | None]

_TRACE = "opentelemetry.trace"
_CONTEXT = "opentelemetry.context"

#: The instrumentation scope of soniq_django's spans.
SCOPE = "soniq_django"
#: ``messaging.system`` of every span.
SYSTEM = "soniq"
#: The longest ``tracestate`` kept (W3C: a vendor need not propagate more); a longer one is
#: dropped whole, never cut (a cut list would be invalid).
MAX_TRACESTATE = 512
#: The longest ``traceparent`` kept (version 00 has 55 characters; later versions may add).
MAX_TRACEPARENT = 128

_tracer: tuple[Any, Any] | None = None  # (provider, its tracer), made once per provider


def carrying() -> bool:
    """Whether an enqueue now carries a trace context: a valid, sampled span is current.

    False at once when nothing in the process imported OpenTelemetry.
    """
    api = sys.modules.get(_TRACE)
    if api is None:
        return False
    context = api.get_current_span().get_span_context()
    return bool(context.is_valid and context.trace_flags.sampled)


def recording() -> bool:
    """Whether the worker traces its runs: OpenTelemetry is imported and a provider is set."""
    return _provider() is not None


def _provider() -> Any | None:
    """The tracer provider spans are made with; None when none is set (or tracing is off)."""
    api = sys.modules.get(_TRACE)
    if api is None:
        return None
    provider = api.get_tracer_provider()
    if isinstance(provider, (api.ProxyTracerProvider, api.NoOpTracerProvider)):
        return None
    return provider


def _get_tracer(api: Any) -> Any:
    """soniq_django's tracer of the current provider (the proxy's, before one is set)."""
    global _tracer
    provider = api.get_tracer_provider()
    kept = _tracer
    if kept is not None and kept[0] is provider:
        return kept[1]
    tracer = provider.get_tracer(SCOPE)
    _tracer = (provider, tracer)
    return tracer


# The producer ------------------------------------------------------------


def producing(job_name: str | None, queue: str | None, count: int,
              insert: Callable[[Carrier | None], list[uuid.UUID]]) -> list[uuid.UUID]:
    """Run ``insert`` in a PRODUCER span and hand it the context to carry; return its ids.

    ``job_name`` and ``queue`` are the batch's, None when its jobs differ.
    The span is the current one's child; its context (or, with no provider
    set, the current one) is what ``insert`` writes with the jobs. An
    exception of ``insert`` is recorded on the span and raised.
    """
    api = sys.modules[_TRACE]
    attributes: dict[str, Any] = {
        "messaging.system": SYSTEM, "messaging.operation.type": "send",
        "messaging.operation.name": "enqueue"}
    if queue is not None:
        attributes["messaging.destination.name"] = queue
    if job_name is not None:
        attributes["soniq.job.name"] = job_name
    if count != 1:
        attributes["messaging.batch.message_count"] = count
    name = f"soniq enqueue {job_name}" if job_name is not None else "soniq enqueue"
    with _get_tracer(api).start_as_current_span(
            name, kind=api.SpanKind.PRODUCER, attributes=attributes) as span:
        ids = insert(_inject(api))
        if count == 1 and ids:
            span.set_attribute("messaging.message.id", str(ids[0]))
        return ids


def _inject(api: Any) -> Carrier | None:
    """The current span's context as W3C ``traceparent``/``tracestate``; None if not valid."""
    context = api.get_current_span().get_span_context()
    if not context.is_valid:
        return None
    parent = f"00-{context.trace_id:032x}-{context.span_id:016x}-{int(context.trace_flags):02x}"
    state = context.trace_state.to_header() if context.trace_state else None
    if state is not None and (not state or len(state) > MAX_TRACESTATE):
        state = None
    return parent, state


def bound(callback: Callable[[], T]) -> Callable[[], T]:
    """``callback``, run later under the trace context current now (``enqueue_on_commit``).

    ``callback`` itself when no span is to be carried, so that an enqueue
    after the commit costs nothing more.
    """
    if not carrying():
        return callback
    context = sys.modules[_CONTEXT]
    captured = context.get_current()

    def under_captured_context() -> T:
        token = context.attach(captured)
        try:
            return callback()
        finally:
            context.detach(token)

    return under_captured_context


def keep(alias: str, ids: Iterable[uuid.UUID], carrier: Carrier | None) -> None:
    """Write ``carrier`` as the trace context of each job in ``ids`` that has none yet.

    Called inside the enqueue's transaction, after its rows were written. A
    job that already has one (a unique or dedup job enqueued before) keeps
    it. Raises the database's error (the caller translates it).
    """
    if carrier is None:
        return
    wanted = list(dict.fromkeys(ids))
    if not wanted:
        return
    from django.db import connections

    from .models import JobTrace

    parent, state = carrier
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO soniq_job_trace (job_id, traceparent, tracestate) "
                "SELECT pg_catalog.unnest(%s::uuid[]), %s, %s ON CONFLICT (job_id) DO NOTHING",
                [wanted, parent, state])
        return
    JobTrace.objects.using(alias).bulk_create(
        [JobTrace(job_id=job_id, traceparent=parent, tracestate=state) for job_id in wanted],
        ignore_conflicts=True)


# The worker --------------------------------------------------------------


def carriers(alias: str, job_ids: list[str]) -> dict[str, Carrier]:
    """The carried contexts of ``job_ids`` (text), by job id as text; one query.

    Empty when none has one, or when they cannot be read (logged at DEBUG:
    a run is never held up by its trace).
    """
    if not job_ids:
        return {}
    from django.db import connections, transaction

    from .models import JobTrace

    rows = JobTrace.objects.using(alias).filter(job_id__in=job_ids).values_list(
        "job_id", "traceparent", "tracestate")
    try:
        if connections[alias].in_atomic_block:  # a failure must leave the caller's transaction
            with transaction.atomic(using=alias):
                return {str(job_id): (parent, state) for job_id, parent, state in rows}
        return {str(job_id): (parent, state) for job_id, parent, state in rows}
    except Exception:  # the table missing (migration 0021 not applied), an outage...
        logger.debug("could not read the trace contexts of %d job(s)", len(job_ids),
                     exc_info=True)
        return {}


def job_span(job_id: str, job_name: str, queue: str, attempt: int,
             carrier: Carrier | None) -> Any | None:
    """A started CONSUMER span for one run of a job; None when the worker does not trace.

    The span starts a trace of its own, linked to the carried context when
    there is one (decision 0041 says why a link rather than a parent). It
    is not current yet: ``activate`` it where the handler runs.
    """
    provider = _provider()
    if provider is None:
        return None
    try:
        return _start_job_span(job_id, job_name, queue, attempt, carrier)
    except Exception:  # a run is never held up by its trace
        logger.debug("could not start the span of %s %s", job_name, job_id, exc_info=True)
        return None


def _start_job_span(job_id: str, job_name: str, queue: str, attempt: int,
                    carrier: Carrier | None) -> Any:
    api = sys.modules[_TRACE]
    links = None
    linked = _extract(api, carrier)
    if linked is not None:
        links = [api.Link(linked)]
    attributes = {
        "messaging.system": SYSTEM, "messaging.operation.type": "process",
        "messaging.operation.name": "process", "messaging.destination.name": queue,
        "messaging.message.id": job_id, "soniq.job.name": job_name,
        "soniq.job.attempt": attempt}
    root = sys.modules[_CONTEXT].Context()  # a trace of its own, whatever is current here
    return _get_tracer(api).start_span(f"soniq process {job_name}", context=root,
                                       kind=api.SpanKind.CONSUMER, links=links,
                                       attributes=attributes)


def _extract(api: Any, carrier: Carrier | None) -> Any | None:
    """The ``SpanContext`` a carrier holds (remote), or None when it holds none that is valid."""
    if carrier is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    parent, state = carrier
    headers = {"traceparent": parent} if state is None else {"traceparent": parent,
                                                              "tracestate": state}
    context = api.get_current_span(TraceContextTextMapPropagator().extract(headers))
    span_context = context.get_span_context()
    return span_context if span_context.is_valid else None


def activate(span: Any) -> Any:
    """Make ``span`` current in this thread or task; returns the token ``deactivate`` takes."""
    api = sys.modules[_TRACE]
    return sys.modules[_CONTEXT].attach(api.set_span_in_context(span))


def deactivate(token: Any) -> None:
    """Undo ``activate`` (in the same thread or task)."""
    sys.modules[_CONTEXT].detach(token)


def finish(span: Any, outcome: str, *, dead_letter_reason: str | None = None,
           exception: BaseException | None = None, error: str | None = None) -> None:
    """End a run's span with how it ended: ``soniq.job.outcome`` and, on failure, an error.

    ``outcome`` is as the ``job_finished`` signal names it (done, retry,
    dead, cancelled, deferred); a failure (retry or dead) sets the span's
    status to ERROR, records ``exception`` if the handler raised one (else
    ``error``, the worker's own words, as the status description), and a
    dead letter's reason as ``soniq.dead_letter_reason``.
    """
    api = sys.modules[_TRACE]
    try:
        span.set_attribute("soniq.job.outcome", outcome)
        if dead_letter_reason is not None:
            span.set_attribute("soniq.dead_letter_reason", dead_letter_reason)
        if outcome in ("retry", "dead"):
            if exception is not None:
                span.record_exception(exception)
                description = type(exception).__name__
            else:
                description = (error or outcome).splitlines()[0][:200]
            span.set_status(api.Status(api.StatusCode.ERROR, description))
    finally:
        span.end()

