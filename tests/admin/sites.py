"""A URLconf with admin sites that register only some of soniq's admins (tests/admin/test_admin_access.py).

- ``/admin/``: the default site, as everywhere else;
- ``/jobs-only/``: the jobs admin and the dashboard, nothing else;
- ``/no-jobs/``: the queue settings admin and the dashboard, without the jobs admin;
- ``/strict/``: every admin, with a queue settings admin that refuses every change the
  usual Django way (its ``has_change_permission``), whatever the user's permissions.
"""

from django.contrib import admin
from django.contrib.admin import AdminSite
from django.urls import path

from soniq_django import admin as soniq_admin
from soniq_django.models import DeadLetterJob, Job, QueueSetting, RecurringJob, Worker


class FrozenQueueSettings(soniq_admin.QueueSettingAdmin):
    def has_change_permission(self, request, obj=None):
        return False


jobs_only = AdminSite(name="jobs_only")
jobs_only.register(Job, soniq_admin.JobAdmin)
soniq_admin.add_dashboard(jobs_only)

no_jobs = AdminSite(name="no_jobs")
no_jobs.register(QueueSetting, soniq_admin.QueueSettingAdmin)
soniq_admin.add_dashboard(no_jobs)

strict = AdminSite(name="strict")
for model, model_admin in [(Job, soniq_admin.JobAdmin),
                           (DeadLetterJob, soniq_admin.DeadLetterJobAdmin),
                           (RecurringJob, soniq_admin.RecurringJobAdmin),
                           (QueueSetting, FrozenQueueSettings),
                           (Worker, soniq_admin.WorkerAdmin)]:
    strict.register(model, model_admin)
soniq_admin.register_task_registry(strict)
soniq_admin.add_dashboard(strict)

urlpatterns = [
    path("admin/", admin.site.urls),
    path("jobs-only/", jobs_only.urls),
    path("no-jobs/", no_jobs.urls),
    path("strict/", strict.urls),
]
