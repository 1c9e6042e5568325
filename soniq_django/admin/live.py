"""What the dashboard shows, for its page and for its live endpoint.

The page and the endpoint build the same context (``dashboard_context``):
the overview snapshot, the waits of each queue (``soniq_django.waits``:
queued jobs split into due, scheduled and retrying, each queue's limits and
what holds its due jobs back, the live workers' slots), and what this user
may see of them (``access.dashboard_access``: the parts whose admin pages
refuse the user are left out, of the page and of the JSON alike). The
endpoint answers with the figures as JSON and with each module's body
rendered again from its own template (``dashboard/<module>.html``), which
static/soniq_django/dashboard.js swaps in place; so the page and its
refreshes are drawn by the same templates.
"""

from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.db import router
from django.http import HttpRequest, JsonResponse
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.utils.http import urlencode

from .. import overview, waits
from ..keys.limits import key_states
from ..models import Job, JobStatus, QueueSetting
from .access import DashboardAccess, dashboard_access

REFRESH_SECONDS = 5
"""How often an open dashboard asks for new figures (paused while its tab is hidden)."""

MODULES = (
    ("soniq-queues", "admin/soniq_django/dashboard/queues.html"),
    ("soniq-keys", "admin/soniq_django/dashboard/keys.html"),
    ("soniq-throughput", "admin/soniq_django/dashboard/throughput.html"),
    ("soniq-dead-letters", "admin/soniq_django/dashboard/dead_letters.html"),
    ("soniq-workers", "admin/soniq_django/dashboard/workers.html"),
    ("soniq-tasks", "admin/soniq_django/dashboard/tasks.html"),
)
"""The dashboard's modules, top to bottom: element id and the template of its body."""

_MODULE_ACCESS = {"soniq-dead-letters": "dead_letters", "soniq-tasks": "tasks",
                  "soniq-keys": "keys"}
"""Modules shown only to a user whose admin page of that table would show it."""

QUEUED_PARTS = (("due", "Due now", "Queued jobs that may run now"),
                ("scheduled", "Scheduled", "Queued for a later run_at, never tried yet"),
                ("retrying", "Retrying",
                 "Tried before; waiting for their retry's run_at (the backoff)"),
                ("waiting", "Waiting",
                 "Waiting for the jobs they depend on (depends_on, a chain, a batch's "
                 "callback); released when those are done"))
"""The queued column, split: (key, heading, what it counts)."""
_QUEUED_KEYS = frozenset(key for key, _, _ in QUEUED_PARTS)

ESTIMATE_NOTE = ("Numbers marked ≈ are estimates from the table's statistics: counting the "
                 "finished jobs would read the whole table. Queued and running jobs are "
                 "counted.")


@dataclass(frozen=True)
class Cell:
    """One number of the queue table, with the list it links to (None: no link)."""

    key: str
    count: int
    url: str | None
    estimated: bool = False  # the count is an estimate from the table's statistics


@dataclass(frozen=True)
class DashboardQueue:
    """A row of the queue table: its numbers, its limits and what holds its due jobs back."""

    name: str
    row: overview.QueueRow
    waits: waits.QueueWaits
    cells: tuple[Cell, ...]
    paused: bool
    paused_by: str | None  # None unless the user may view queue settings
    paused_at: Any
    can_pause: bool
    can_resume: bool


def _empty_row(name: str) -> overview.QueueRow:
    return overview.QueueRow(queue=name, cells=tuple((s, 0) for s in overview.STATUS_COLUMNS),
                             waiting_since=None, oldest_wait=None)


def columns(access: DashboardAccess) -> list[tuple[str, str, str]]:
    """The queue table's number columns: (key, heading, what it counts)."""
    found = list(QUEUED_PARTS)
    found += [(status, overview.LABELS[status], "") for status in overview.STATUS_COLUMNS
              if status != JobStatus.QUEUED
              and (status != overview.DEAD_LETTER or access.dead_letters)]
    return found


class _Links:
    """The changelist URLs the numbers link to, on the dashboard's own site."""

    def __init__(self, site: admin.AdminSite, access: DashboardAccess):
        self.jobs = reverse("admin:soniq_django_job_changelist", current_app=site.name)
        self.dead = reverse("admin:soniq_django_deadletterjob_changelist",
                            current_app=site.name) if access.dead_letters else None

    def of(self, queue: str, key: str) -> str | None:
        if key == overview.DEAD_LETTER:
            return f"{self.dead}?{urlencode({'queue': queue})}" if self.dead else None
        status = JobStatus.QUEUED if key in _QUEUED_KEYS else key
        return f"{self.jobs}?{urlencode({'queue': queue, 'status__exact': status})}"


def _cells(counts: dict[str, int], keys: list[str], links: _Links | None, queue: str,
           estimated: frozenset[str] = frozenset()) -> tuple[Cell, ...]:
    return tuple(Cell(key, counts.get(key, 0),
                      links.of(queue, key) if links and counts.get(key) else None,
                      key in estimated)
                 for key in keys)


def queues(request: HttpRequest, snapshot: overview.Snapshot, found: waits.Waits,
           access: DashboardAccess, links: _Links) -> tuple[DashboardQueue, ...]:
    """Every queue with jobs, dead letters or a settings row, by name.

    A paused queue with no jobs left still gets its row, so it can be resumed here.
    """
    rows = {row.queue: row for row in snapshot.queues}
    keys = [key for key, _, _ in columns(access)]
    result = []
    for name in sorted(set(rows) | set(found.queues)):
        row = rows.get(name) or _empty_row(name)
        wait = found.queues.get(name) or waits.QueueWaits(name, 0, 0, 0, waits.Limits(), ())
        counts = {**dict(row.cells),
                  **{part: getattr(wait, part) for part in waits.QUEUED_PARTS}}
        # The row as the permission checks see it (read by waits.read already).
        setting = QueueSetting(queue=name, paused=wait.limits.paused) \
            if wait.limits.has_row else None
        result.append(DashboardQueue(
            name=name, row=row, waits=wait,
            cells=_cells(counts, keys, links, name, snapshot.estimated),
            paused=wait.limits.paused,
            paused_by=wait.limits.paused_by if access.queue_settings else None,
            paused_at=wait.limits.paused_at if access.queue_settings else None,
            can_pause=not wait.limits.paused and access.may_pause(request, setting),
            can_resume=wait.limits.paused and access.may_resume(request, setting)))
    return tuple(result)


def dashboard_context(request: HttpRequest, site: admin.AdminSite) -> dict[str, Any]:
    """The figures every dashboard template reads (without the admin site's context)."""
    access = dashboard_access(request, site)
    using = router.db_for_read(Job)
    # Estimated where counting would read the whole table (the finished jobs).
    snapshot = overview.snapshot(using, estimate=True)
    counts = {row.queue: dict(row.cells) for row in snapshot.queues}
    found = waits.read(using, snapshot.now,
                       {name: cells.get(JobStatus.QUEUED, 0) for name, cells in counts.items()},
                       {name: cells.get(JobStatus.PROCESSING, 0)
                        for name, cells in counts.items()},
                       snapshot.live_workers)
    links = _Links(site, access)
    keys = [key for key, _, _ in columns(access)]
    totals = {**dict(snapshot.totals), **found.totals}
    return {
        "snapshot": snapshot,
        "waits": found,
        "access": access,
        "queues": queues(request, snapshot, found, access, links),
        "totals": _cells(totals, keys, None, "", snapshot.estimated),
        "estimate_note": ESTIMATE_NOTE if snapshot.estimated else "",
        "chart": overview.chart(snapshot.throughput),
        "columns": columns(access),
        "legend": [(kind, overview.LABELS[kind]) for kind in overview.CHART_KINDS],
        "time_zone": timezone.get_current_timezone_name(),
        "app_label": Job._meta.app_label,
        "workers": [(worker, found.workers.get(worker.id)) for worker in snapshot.live_workers],
        "modules": [{"id": module_id, "template": template} for module_id, template in MODULES
                    if getattr(access, _MODULE_ACCESS.get(module_id, "jobs"))],
        "refresh_seconds": REFRESH_SECONDS,
        "keys_at_limit": key_states(at_limit_only=True, limit=20, using=using)
        if access.keys else [],
    }


def _limits(limits: waits.Limits) -> dict[str, Any]:
    return {"concurrency": limits.concurrency, "running": limits.running,
            "rate": list(limits.rate) if limits.rate else None, "started": limits.started}


def figures(context: dict[str, Any]) -> dict[str, Any]:
    """The dashboard's numbers as plain JSON values (the live endpoint's ``figures``).

    What the page leaves out for this user (dead letters, who paused a
    queue) is left out here too.
    """
    snapshot: overview.Snapshot = context["snapshot"]
    access: DashboardAccess = context["access"]
    found: waits.Waits = context["waits"]
    hidden = set() if access.dead_letters else {overview.DEAD_LETTER}
    result = {
        "queues": [
            {"queue": queue.name, "paused": queue.paused,
             "counts": {key: n for key, n in queue.row.cells if key not in hidden},
             "queued": {part: getattr(queue.waits, part) for part in waits.QUEUED_PARTS},
             "limits": _limits(queue.waits.limits),
             "held_back_by": list(queue.waits.held_back_by),
             "oldest_wait_seconds": None if queue.row.oldest_wait is None
             else round(queue.row.oldest_wait.total_seconds(), 3)}
            for queue in context["queues"]
        ],
        "totals": {key: n for key, n in snapshot.totals if key not in hidden},
        "queued_totals": found.totals,
        "live_workers": len(snapshot.live_workers),
        "silent_workers": snapshot.silent_workers,
        "slots": found.slots,
        "slots_in_use": found.slots_in_use,
        "finished_last_hour": sum(minute.total for minute in snapshot.throughput),
        "estimated": sorted(snapshot.estimated),
    }
    if access.dead_letters:
        result["dead_letters_by_reason"] = dict(snapshot.dead_letters_by_reason)
    return result


def live_response(request: HttpRequest, site: admin.AdminSite) -> JsonResponse:
    """The live endpoint's answer: the time, the figures and each module's body."""
    context = dashboard_context(request, site)
    now = timezone.localtime(context["snapshot"].now)
    return JsonResponse({
        "as_of": now.isoformat(),
        "as_of_text": now.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "updated_text": now.strftime("%H:%M:%S"),
        "refresh_seconds": REFRESH_SECONDS,
        "figures": figures(context),
        "modules": {module["id"]: render_to_string(module["template"], context,
                                                   request=request)
                    for module in context["modules"]},
    })  # admin_view adds never_cache: no browser or proxy keeps an answer
