"""``metrics_view``: the queue-level series and this process's counters, for Prometheus.

Open like any view: protect it where you route it (docs/metrics.md,
decision 0019). The queue-level series come from the jobs database the
routers name for reading (one query per scrape).
"""

from django.db import router
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..models import Job
from .process import process_collectors
from .queues import QueueCollector

_registries: dict[str, CollectorRegistry] = {}


def registry_for(using: str) -> CollectorRegistry:
    """The registry a scrape of database ``using`` reads: made once per alias."""
    registry = _registries.get(using)
    if registry is None:
        registry = CollectorRegistry()
        for collector in process_collectors():
            registry.register(collector)
        registry.register(QueueCollector(using))
        registry = _registries.setdefault(using, registry)
    return registry


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text format (or OpenMetrics, when the scraper asks for it); GET only."""
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
    body = encoder(registry_for(router.db_for_read(Job)))
    return HttpResponse(body, content_type=content_type)
