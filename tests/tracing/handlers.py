"""The handlers the tracing tests run: each notes the span it ran under and opens one inside."""

import asyncio

from opentelemetry import trace

from soniq_django import job

#: What each handler below saw as its current span: (trace id, span id), by job name.
seen: dict[str, tuple[int, int]] = {}


def _here(name: str) -> None:
    context = trace.get_current_span().get_span_context()
    seen[name] = (context.trace_id, context.span_id)
    with trace.get_tracer("tests.tracing").start_as_current_span(f"inside {name}"):
        pass


@job(name="tracing.ok")
def traced_ok(n: int = 0) -> int:
    _here("tracing.ok")
    return n


@job(name="tracing.async_ok")
async def traced_async_ok(n: int = 0) -> int:
    await asyncio.sleep(0)
    _here("tracing.async_ok")
    return n


@job(name="tracing.fails", retries=1)
def traced_fails() -> None:
    raise ValueError("tracing boom")


@job(name="tracing.atomic", atomic=True)
def traced_atomic() -> None:
    _here("tracing.atomic")
