"""Read-only admin for ``soniq_workers``; each worker's page lists the job names it registered."""

from typing import Any

from django.contrib import admin
from django.db.models import BooleanField, Case, Q, QuerySet, Value, When
from django.http import HttpRequest
from django.utils.html import format_html_join

from .. import overview
from ..models import TaskRegistration, Worker, WorkerState
from .access import may_view
from .base import ReadOnlyAdmin
from .display import pretty_json, visible_list, when
from .registry import registration_url


class _EveryQueueFilter(admin.SimpleListFilter):
    """Workers that serve every queue (an empty or NULL list), or a named one."""

    title = "queues"
    parameter_name = "serves"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("all", "every queue"), ("some", "named queues")]

    def queryset(self, request: HttpRequest, queryset: QuerySet) -> QuerySet:
        every = Q(queues__isnull=True) | Q(queues=[])
        if self.value() == "all":
            return queryset.filter(every)
        if self.value() == "some":
            return queryset.exclude(every)
        return queryset


@admin.register(Worker)
class WorkerAdmin(ReadOnlyAdmin):
    list_display = ("hostname", "pid", "status", "alive", "queues_shown", "concurrency",
                    "version", "started", "heartbeat")
    list_filter = ("status", _EveryQueueFilter, "hostname")
    search_fields = ("hostname", "version")
    ordering = ("-last_heartbeat",)
    fields = ("id", "hostname", "pid", "status", "queues_shown", "concurrency", "version",
              "started", "heartbeat", "metadata_shown", "handles")
    readonly_fields = fields

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        """Without "handles" for a user the task registry's admin refuses (or when it has none)."""
        fields = super().get_fields(request, obj)
        if may_view(request, self.admin_site, TaskRegistration):
            return fields
        return tuple(field for field in fields if field != "handles")

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        """The rows, each with ``live_now``: live by the database's clock, not this host's."""
        queryset = super().get_queryset(request)
        live = ~Q(status=WorkerState.STOPPED) & Q(
            last_heartbeat__gte=overview.live_since(queryset.db))
        return queryset.annotate(live_now=Case(When(live, then=Value(True)), default=Value(False),
                                               output_field=BooleanField()))

    @admin.display(description="live", boolean=True)
    def alive(self, obj: Worker) -> bool:
        return bool(getattr(obj, "live_now", False))

    @admin.display(description="started", ordering="started_at")
    def started(self, obj: Worker) -> str:
        return when(obj.started_at)

    @admin.display(description="last heartbeat", ordering="last_heartbeat")
    def heartbeat(self, obj: Worker) -> str:
        return when(obj.last_heartbeat)

    @admin.display(description="queues")
    def queues_shown(self, obj: Worker) -> str:
        return visible_list(obj.queues) if obj.queues else "all"

    @admin.display(description="metadata")
    def metadata_shown(self, obj: Worker) -> str:
        return pretty_json(obj.metadata)

    @admin.display(description="handles")
    def handles(self, obj: Worker) -> str:
        """The job names this worker registered in soniq_task_registry, each linked to its row."""
        rows = TaskRegistration.objects.using(obj._state.db).filter(
            worker_id=str(obj.id)).order_by("task_name").only("task_name", "worker_id", "queue")
        if not rows:
            return "-"
        return format_html_join(", ", '<a href="{}">{}</a>{}', (
            (registration_url(row, self.admin_site.name), row.task_name,
             f" ({row.queue})" if row.queue else "") for row in rows))
