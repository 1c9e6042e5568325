"""What the dashboard shows, for its page and for its live endpoint.

The page and the endpoint build the same context (``dashboard_context``):
the overview snapshot, plus each queue's pause state from
``soniq_queue_settings``. The endpoint answers with the figures as JSON and
with each module's body rendered again from its own template
(``dashboard/<module>.html``), which static/soniq_django/dashboard.js swaps
in place; so the page and its refreshes are drawn by the same templates.
"""

from dataclasses import dataclass
from typing import Any

from django.db import router
from django.http import HttpRequest, JsonResponse
from django.template.loader import render_to_string
from django.utils import timezone

from .. import overview
from ..models import Job, QueueSetting

REFRESH_SECONDS = 5
"""How often an open dashboard asks for new figures (paused while its tab is hidden)."""

MODULES = (
    ("soniq-queues", "admin/soniq_django/dashboard/queues.html"),
    ("soniq-throughput", "admin/soniq_django/dashboard/throughput.html"),
    ("soniq-dead-letters", "admin/soniq_django/dashboard/dead_letters.html"),
    ("soniq-workers", "admin/soniq_django/dashboard/workers.html"),
    ("soniq-tasks", "admin/soniq_django/dashboard/tasks.html"),
)
"""The dashboard's modules, top to bottom: element id and the template of its body."""


@dataclass(frozen=True)
class DashboardQueue:
    """A row of the queue table: the snapshot's counts and the queue's pause state."""

    name: str
    row: overview.QueueRow
    paused: bool
    paused_by: str | None
    paused_at: Any


def _empty_row(name: str) -> overview.QueueRow:
    return overview.QueueRow(queue=name, cells=tuple((s, 0) for s in overview.STATUS_COLUMNS),
                             waiting_since=None, oldest_wait=None)


def queues(snapshot: overview.Snapshot, using: str) -> tuple[DashboardQueue, ...]:
    """Every queue with jobs, dead letters or a settings row, by name (one more query).

    A paused queue with no jobs left still gets its row, so it can be resumed here.
    """
    settings = {row.queue: row for row in QueueSetting.objects.using(using)
                .only("queue", "paused", "paused_by", "paused_at")}
    rows = {row.queue: row for row in snapshot.queues}
    found = []
    for name in sorted(set(rows) | set(settings)):
        setting = settings.get(name)
        found.append(DashboardQueue(
            name=name, row=rows.get(name) or _empty_row(name),
            paused=bool(setting and setting.paused),
            paused_by=setting.paused_by if setting else None,
            paused_at=setting.paused_at if setting else None))
    return tuple(found)


def dashboard_context(request: HttpRequest) -> dict[str, Any]:
    """The figures every dashboard template reads (without the admin site's context)."""
    snapshot = overview.snapshot(router.db_for_read(Job))
    return {
        "snapshot": snapshot,
        "queues": queues(snapshot, router.db_for_read(QueueSetting)),
        "chart": overview.chart(snapshot.throughput),
        "columns": [(status, overview.LABELS[status]) for status in overview.STATUS_COLUMNS],
        "legend": [(kind, overview.LABELS[kind]) for kind in overview.CHART_KINDS],
        "time_zone": timezone.get_current_timezone_name(),
        "app_label": Job._meta.app_label,
        "can_pause": request.user.has_perm("soniq_django.change_queuesetting"),
        "modules": [{"id": module_id, "template": template} for module_id, template in MODULES],
        "refresh_seconds": REFRESH_SECONDS,
    }


def figures(context: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's numbers as plain JSON values (the live endpoint's ``figures``)."""
    snapshot: overview.Snapshot = context["snapshot"]
    return {
        "queues": [
            {"queue": queue.name, "paused": queue.paused, "counts": dict(queue.row.cells),
             "oldest_wait_seconds": None if queue.row.oldest_wait is None
             else round(queue.row.oldest_wait.total_seconds(), 3)}
            for queue in context["queues"]
        ],
        "totals": dict(snapshot.totals),
        "dead_letters_by_reason": dict(snapshot.dead_letters_by_reason),
        "live_workers": len(snapshot.live_workers),
        "silent_workers": snapshot.silent_workers,
        "finished_last_hour": sum(minute.total for minute in snapshot.throughput),
    }


def live_response(request: HttpRequest) -> JsonResponse:
    """The live endpoint's answer: the time, the figures and each module's body."""
    context = dashboard_context(request)
    now = timezone.localtime(context["snapshot"].now)
    return JsonResponse({
        "as_of": now.isoformat(),
        "as_of_text": now.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "updated_text": now.strftime("%H:%M:%S"),
        "refresh_seconds": REFRESH_SECONDS,
        "figures": figures(context),
        "modules": {module_id: render_to_string(template, context, request=request)
                    for module_id, template in MODULES},
    })  # admin_view adds never_cache: no browser or proxy keeps an answer
