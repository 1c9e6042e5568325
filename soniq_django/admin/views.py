"""The dashboard page, its live endpoint and its queue buttons, and the URLs that serve them."""

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBase, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path
from django.views.decorators.http import require_GET, require_POST

from .live import dashboard_context, live_response
from .queue_buttons import queue_action

VIEW_PERMISSION = "soniq_django.view_job"


def _check_view(request: HttpRequest, site: admin.AdminSite) -> None:
    if not request.user.has_perm(VIEW_PERMISSION):
        raise PermissionDenied
    request.current_app = site.name  # {% url 'admin:…' %} resolves on this site


def dashboard_view(request: HttpRequest, site: admin.AdminSite) -> TemplateResponse:
    """Queues, workers and the last hour's throughput; needs the "view job" permission."""
    _check_view(request, site)
    context = {**site.each_context(request), "title": "Soniq dashboard",
               **dashboard_context(request)}
    return TemplateResponse(request, "admin/soniq_django/dashboard.html", context)


def dashboard_live_view(request: HttpRequest, site: admin.AdminSite) -> JsonResponse:
    """The dashboard's figures and module bodies as JSON; the same permission as the page."""
    _check_view(request, site)
    return live_response(request)


def dashboard_queue_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponseBase:
    """POST ``queue`` and ``action`` (pause or resume); needs "change queue setting"."""
    _check_view(request, site)
    return queue_action(request, site.name)


def add_dashboard(site: admin.AdminSite) -> None:
    """Serve the dashboard at ``<admin>/soniq_django/dashboard/`` on ``site``.

    Also its live endpoint (``dashboard/live/``) and the target of its
    Pause/Resume buttons (``dashboard/queue/``). Done for
    ``django.contrib.admin.site`` when ``soniq_django.admin`` is imported
    (by admin autodiscovery); call it for a custom ``AdminSite`` that
    registers these model admins. Calling it twice is harmless.
    """
    if getattr(site, "_soniq_dashboard", False):
        return
    site_urls = site.get_urls

    def get_urls() -> list[Any]:
        @require_GET
        def page(request: HttpRequest) -> TemplateResponse:
            return dashboard_view(request, site)

        @require_GET
        def live(request: HttpRequest) -> JsonResponse:
            return dashboard_live_view(request, site)

        @require_POST
        def queue(request: HttpRequest) -> HttpResponseBase:
            return dashboard_queue_view(request, site)

        return [
            path("soniq_django/dashboard/", site.admin_view(page),
                 name="soniq_django_dashboard"),
            path("soniq_django/dashboard/live/", site.admin_view(live),
                 name="soniq_django_dashboard_live"),
            path("soniq_django/dashboard/queue/", site.admin_view(queue),
                 name="soniq_django_dashboard_queue"),
            *site_urls(),
        ]

    site.get_urls = get_urls
    site._soniq_dashboard = True
