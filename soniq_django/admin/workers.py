"""Read-only admins for ``soniq_workers`` and ``soniq_task_registry``."""

from django.contrib import admin
from django.utils import timezone

from .. import dashboard
from ..models import TaskRegistration, Worker, WorkerState
from .display import when


class _ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Worker)
class WorkerAdmin(_ReadOnlyAdmin):
    list_display = ("hostname", "pid", "status", "alive", "queues_shown", "concurrency",
                    "started", "last_heartbeat")
    list_filter = ("status", "hostname")
    search_fields = ("hostname",)
    ordering = ("-last_heartbeat_at",)

    @admin.display(description="live", boolean=True)
    def alive(self, obj):
        recent = obj.last_heartbeat_at >= timezone.now() - dashboard.live_window()
        return obj.status != WorkerState.STOPPED and recent

    @admin.display(description="started", ordering="started_at")
    def started(self, obj):
        return when(obj.started_at)

    @admin.display(description="last heartbeat", ordering="last_heartbeat_at")
    def last_heartbeat(self, obj):
        return when(obj.last_heartbeat_at)

    @admin.display(description="queues")
    def queues_shown(self, obj):
        return ", ".join(obj.queues) if isinstance(obj.queues, list) else "all"


@admin.register(TaskRegistration)
class TaskRegistrationAdmin(_ReadOnlyAdmin):
    list_display = ("job_name", "queue", "max_attempts", "unique_job", "updated_at")
    list_filter = ("queue", "unique_job")
    search_fields = ("job_name",)
    ordering = ("job_name",)
