"""The dashboard page, and the URL that serves it on an admin site."""

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.db import router
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.urls import path
from django.utils import timezone

from .. import overview
from ..models import Job


def dashboard_view(request: HttpRequest, site: admin.AdminSite) -> TemplateResponse:
    """Queues, workers and the last hour's throughput; needs the "view job" permission."""
    if not request.user.has_perm("soniq_django.view_job"):
        raise PermissionDenied
    request.current_app = site.name  # {% url 'admin:…' %} resolves on this site
    snapshot = overview.snapshot(router.db_for_read(Job))
    context = {
        **site.each_context(request),
        "title": "Soniq dashboard",
        "snapshot": snapshot,
        "chart": overview.chart(snapshot.throughput),
        "columns": [(status, overview.LABELS[status]) for status in overview.STATUS_COLUMNS],
        "legend": [(kind, overview.LABELS[kind]) for kind in overview.CHART_KINDS],
        "time_zone": timezone.get_current_timezone_name(),
        "app_label": Job._meta.app_label,
    }
    return TemplateResponse(request, "admin/soniq_django/dashboard.html", context)


def add_dashboard(site: admin.AdminSite) -> None:
    """Serve the dashboard at ``<admin>/soniq_django/dashboard/`` on ``site``.

    Done for ``django.contrib.admin.site`` when ``soniq_django.admin`` is
    imported (by admin autodiscovery); call it for a custom ``AdminSite``
    that registers these model admins. Calling it twice is harmless.
    """
    if getattr(site, "_soniq_dashboard", False):
        return
    site_urls = site.get_urls

    def get_urls() -> list[Any]:
        def view(request: HttpRequest) -> TemplateResponse:
            return dashboard_view(request, site)

        return [path("soniq_django/dashboard/", site.admin_view(view),
                     name="soniq_django_dashboard"), *site_urls()]

    site.get_urls = get_urls
    site._soniq_dashboard = True
