"""The Django admin for soniq's tables, and the dashboard page.

Jobs and dead letters are read-only: every change goes through a service
(``operations``, ``replay``) called by an action, never through ``save()``.
Recurring schedules can be added and edited, and so can queue settings
(pause, the operator's limits). Workers and the task registry
are read-only. ``claim_token`` is never loaded, listed, searched or shown:
it is the secret half of a claim fence. No changelist accepts a URL lookup
its own filters do not make, and none on a fence column at all.
Changelists load only the columns they list, so a page costs the same
queries with ten rows or a million. See docs/admin.md.
"""

from django.contrib import admin

from .base import FENCE_COLUMNS, OfferedLookupsOnly, ReadOnlyAdmin
from .jobs import DeadLetterJobAdmin, JobAdmin
from .keys import KeyLimitAdmin, KeySlotAdmin
from .queues import QueueSettingAdmin
from .registry import TaskRegistrationAdmin, register_task_registry
from .recurring import RecurringJobAdmin, RecurringJobForm
from .views import add_dashboard, dashboard_view
from .workers import WorkerAdmin

__all__ = [
    "FENCE_COLUMNS", "DeadLetterJobAdmin", "JobAdmin", "KeyLimitAdmin", "KeySlotAdmin",
    "OfferedLookupsOnly", "QueueSettingAdmin",
    "ReadOnlyAdmin", "RecurringJobAdmin", "RecurringJobForm", "TaskRegistrationAdmin", "WorkerAdmin",
    "add_dashboard", "dashboard_view", "register_task_registry",
]

register_task_registry(admin.site)
add_dashboard(admin.site)
