"""A real OpenTelemetry SDK for the tracing tests, with an in-memory exporter.

``spans`` sets a ``TracerProvider`` as the process's global one for one
test and takes it away after, so the other tests of the session run as a
project without a provider does (OpenTelemetry sets its global once per
process; its own test utilities reset it the same way).
"""

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once


def _unset_provider() -> None:
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None


class Spans:
    """The spans ended during the test, read from the in-memory exporter."""

    def __init__(self, exporter: InMemorySpanExporter, provider: TracerProvider):
        self.exporter = exporter
        self.tracer = provider.get_tracer("tests.tracing")

    def all(self):
        return list(self.exporter.get_finished_spans())

    def named(self, name: str):
        return [span for span in self.all() if span.name == name]

    def one(self, name: str):
        found = self.named(name)
        assert len(found) == 1, [span.name for span in self.all()]
        return found[0]

    def clear(self) -> None:
        self.exporter.clear()


@pytest.fixture
def spans():
    """A global SDK tracer provider for this test; the ended spans."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    _unset_provider()
    trace.set_tracer_provider(provider)
    try:
        yield Spans(exporter, provider)
    finally:
        provider.shutdown()
        _unset_provider()
