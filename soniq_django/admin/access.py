"""What a user may see and do on the dashboard: the checks of the admin pages it mirrors.

The dashboard shows parts of several tables, and its buttons change one.
Each part is shown, and each button works, only when the ModelAdmin of that
table, *as registered on the dashboard's own site*, allows it: its
``has_view_permission`` for what the page shows, ``has_change_permission``
(with the row) and ``has_add_permission`` for a Pause or Resume. So a
project that restricts an admin the usual Django way (overriding those
methods, or unregistering the admin) restricts the dashboard too, and a
user with only "view job" sees no worker host or pid, no dead-letter
reason, no registered job name and nobody's name as who paused a queue.
"""

from dataclasses import dataclass
from typing import Any

from django.contrib import admin
from django.db.models import Model
from django.http import HttpRequest

from ..keys.models import KeySlot
from ..models import DeadLetterJob, Job, QueueSetting, TaskRegistration, Worker


def model_admin(site: admin.AdminSite, model: type[Model]) -> admin.ModelAdmin | None:
    """The ModelAdmin ``site`` has for ``model``, or None when it has none."""
    found: admin.ModelAdmin | None = site._registry.get(model)
    return found


def may_view(request: HttpRequest, site: admin.AdminSite, model: type[Model]) -> bool:
    """Whether ``site``'s admin of ``model`` lets this user see its rows (False: none)."""
    found = model_admin(site, model)
    return found is not None and bool(found.has_view_permission(request))


@dataclass(frozen=True)
class DashboardAccess:
    """The parts of the dashboard a user may see; each is an admin page's view permission."""

    jobs: bool  # the dashboard itself: counts per queue and state, the throughput
    dead_letters: bool  # dead-letter counts and reasons
    workers: bool  # each live worker's host, pid, queues and version
    tasks: bool  # soniq_task_registry's job names
    queue_settings: bool  # who paused a queue, and when
    queue_admin: Any  # the site's QueueSetting admin (None: not registered), for the buttons
    keys: bool = False  # limits per key: the keys at their limit, and their waiting counts

    def may_pause(self, request: HttpRequest, setting: QueueSetting | None) -> bool:
        """Whether this user's Pause button may pause a queue with this settings row.

        With a row, its admin's change permission for that row; without one,
        a pause adds the row, so its add permission too.
        """
        if self.queue_admin is None:
            return False
        if setting is None:
            return bool(self.queue_admin.has_add_permission(request)
                        and self.queue_admin.has_change_permission(request))
        return bool(self.queue_admin.has_change_permission(request, setting))

    def may_resume(self, request: HttpRequest, setting: QueueSetting | None) -> bool:
        """Whether this user may resume a queue with this row (no row: nothing to resume)."""
        return (self.queue_admin is not None and setting is not None
                and bool(self.queue_admin.has_change_permission(request, setting)))


def dashboard_access(request: HttpRequest, site: admin.AdminSite) -> DashboardAccess:
    """What the dashboard of ``site`` may show this user."""
    return DashboardAccess(
        jobs=may_view(request, site, Job),
        dead_letters=may_view(request, site, DeadLetterJob),
        workers=may_view(request, site, Worker),
        tasks=may_view(request, site, TaskRegistration),
        queue_settings=may_view(request, site, QueueSetting),
        queue_admin=model_admin(site, QueueSetting),
        keys=may_view(request, site, KeySlot),
    )
