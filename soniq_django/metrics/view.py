"""``metrics_view``: the queue-level series and this process's counters, for Prometheus.

Who may read it is ``SONIQ["METRICS_ACCESS"]`` (docs/metrics.md, decision 0039):

- ``"staff"`` (the default): a logged-in, active staff user who may view
  jobs (``soniq_django.view_job``); anyone else gets 403;
- ``"token"``: a request whose ``Authorization`` header is ``Bearer`` and
  ``SONIQ["METRICS_TOKEN"]`` (compared in constant time); anyone else gets
  401 with ``WWW-Authenticate: Bearer``;
- ``"open"``: anyone who reaches the URL (protect it where you route it).

A refused request is answered before any query. The queue-level series
come from the jobs database the routers name for reading, read at most once
per ``SONIQ["METRICS_CACHE_SECONDS"]`` per process (queues.py).
"""

import hmac

from django.db import router
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.utils.cache import add_never_cache_headers, patch_vary_headers
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from ..conf import checked
from ..models import Job
from .process import process_collectors
from .queues import QueueCollector

_registries: dict[str, CollectorRegistry] = {}

VIEW_PERMISSION = "soniq_django.view_job"


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


def _bearer(request: HttpRequest) -> bytes:
    scheme, _, credentials = request.headers.get("Authorization", "").partition(" ")
    return credentials.strip().encode() if scheme.lower() == "bearer" else b""


def refusal(request: HttpRequest) -> HttpResponse | None:
    """The answer to a request ``METRICS_ACCESS`` refuses; None when it may read the metrics.

    Raises ``SettingsInvalid`` when the setting is invalid (soniq.E003).
    """
    access = checked("METRICS_ACCESS")
    if access == "open":
        return None
    if access == "token":
        token = checked("METRICS_TOKEN")
        if hmac.compare_digest(_bearer(request), token.encode()):
            return None
        response = HttpResponse("A bearer token is needed.\n", status=401,
                                content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="soniq metrics"'
        return response
    user = getattr(request, "user", None)
    if (user is not None and user.is_active and user.is_staff
            and user.has_perm(VIEW_PERMISSION)):
        return None
    return HttpResponse("Staff who may view jobs only.\n", status=403,
                        content_type="text/plain")


def metrics_view(request: HttpRequest) -> HttpResponse:
    """The Prometheus text format (or OpenMetrics, when the scraper asks for it); GET only.

    No answer is kept by a browser or a proxy (it depends on who asks).
    """
    if request.method not in ("GET", "HEAD"):
        return HttpResponseNotAllowed(["GET", "HEAD"])
    response = refusal(request)
    if response is None:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        body = encoder(registry_for(router.db_for_read(Job)))
        response = HttpResponse(body, content_type=content_type)
    add_never_cache_headers(response)
    patch_vary_headers(response, ("Authorization", "Cookie"))
    return response
