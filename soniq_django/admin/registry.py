"""Read-only admin for ``soniq_task_registry``: which worker said it handles which job name.

The table is Soniq's, keyed by (job name, worker id): a composite primary
key, which ``AdminSite.register()`` refuses outright, because the admin's
edit, delete and bulk-action paths need a single-column key. This admin
uses none of them: it has a list and a read-only page per row, no actions
and no facet counts. Each row's page is addressed by its key as the JSON
pair ``["job.name","worker id"]`` (admin-quoted), which Django's
CompositePrimaryKey.to_python() reads back. ``register_task_registry(site)``
puts it on a site.
"""

import json
from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html

from ..models import TaskRegistration, Worker
from .base import OnlyListedColumns, ReadOnlyAdmin
from .display import VisibleValuesFilter, parse_uuid, pre, visible, when


def registration_url(registration: TaskRegistration, site_name: str = "admin") -> str:
    """The admin page of one registry row (its composite key, as the admin reads it)."""
    key = json.dumps([registration.task_name, registration.worker_id], separators=(",", ":"))
    return reverse("admin:soniq_django_taskregistration_change", args=[quote(key)],
                   current_app=site_name)


class _RegistryChangeList(OnlyListedColumns):
    def url_for_result(self, result: TaskRegistration) -> str:
        # Django's own version quotes ``result.pk``, a tuple here.
        return registration_url(result, self.model_admin.admin_site.name)


class TaskRegistrationAdmin(ReadOnlyAdmin):
    list_columns = ("task_name", "worker_id", "queue", "max_attempts", "unique_job",
                    "last_seen_at")
    list_display = ("task_name", "queue_shown", "max_attempts_shown", "unique_job",
                    "worker_id", "last_seen")
    list_display_links = ("task_name",)
    list_filter = (("task_name", VisibleValuesFilter), ("queue", VisibleValuesFilter))
    search_fields = ("task_name", "worker_id")
    search_help_text = "Part of a job name or of a worker id."
    ordering = ("task_name", "worker_id")
    list_per_page = 50
    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER  # facet counts COUNT(pk), a pair here
    actions = None
    fields = ("task_name", "worker", "queue_shown", "max_attempts_shown", "unique_job",
              "last_seen", "args_model_repr_pre")
    readonly_fields = fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[_RegistryChangeList]:
        return _RegistryChangeList

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """The row a key names; None (Django's "not found") unless the key is a JSON pair of
        strings without a NUL.

        Django's CompositePrimaryKey.to_python() fails with a TypeError on a
        key such as ``1e999`` or ``NaN`` (a 500): no row has such a key.
        """
        try:
            key = json.loads(object_id)
        except ValueError:
            key = None
        if not (isinstance(key, list) and len(key) == 2
                and all(isinstance(part, str) and "\x00" not in part for part in key)):
            return None
        return super().get_object(request, object_id, from_field)

    @admin.display(description="queue", ordering="queue")
    def queue_shown(self, obj: TaskRegistration) -> str:
        return visible(obj.queue) if obj.queue else "-"  # Soniq's own workers leave it NULL

    @admin.display(description="max attempts", ordering="max_attempts")
    def max_attempts_shown(self, obj: TaskRegistration) -> str | int:
        return "-" if obj.max_attempts is None else obj.max_attempts

    @admin.display(description="last registered", ordering="last_seen_at")
    def last_seen(self, obj: TaskRegistration) -> str:
        return when(obj.last_seen_at)

    @admin.display(description="worker")
    def worker(self, obj: TaskRegistration) -> object:
        """The worker id, linked to its page when it names a row of soniq_workers."""
        worker_id = parse_uuid(obj.worker_id)
        if worker_id is None or not Worker.objects.using(obj._state.db).filter(
                id=worker_id).exists():
            return obj.worker_id
        url = reverse("admin:soniq_django_worker_change", args=[worker_id],
                      current_app=self.admin_site.name)
        return format_html('<a href="{}">{}</a>', url, obj.worker_id)

    @admin.display(description="args model")
    def args_model_repr_pre(self, obj: TaskRegistration) -> str:
        return pre(obj.args_model_repr)


def register_task_registry(site: admin.AdminSite,
                           admin_class: type[TaskRegistrationAdmin] = TaskRegistrationAdmin
                           ) -> None:
    """Show ``soniq_task_registry`` on ``site``, as ``register()`` would for another model.

    Done for ``django.contrib.admin.site`` when ``soniq_django.admin`` is
    imported; call it for a custom ``AdminSite``. Calling it twice is
    harmless.
    """
    if not site.is_registered(TaskRegistration):
        site._registry[TaskRegistration] = admin_class(TaskRegistration, site)
