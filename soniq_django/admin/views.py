"""The dashboard page, its live endpoint and its queue buttons, and the URLs that serve them."""

from typing import Any

from django.contrib import admin
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponseBase, JsonResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.views.decorators.http import require_GET, require_POST

from ..models import Job
from .access import model_admin
from .live import dashboard_context, live_response
from .queue_buttons import queue_action


def _check_view(request: HttpRequest, site: admin.AdminSite) -> None:
    """The jobs admin of ``site`` must let the user view jobs (no jobs admin there: 404)."""
    jobs = model_admin(site, Job)
    if jobs is None:
        raise Http404("no jobs admin on this site")
    if not jobs.has_view_permission(request):
        raise PermissionDenied
    request.current_app = site.name  # {% url 'admin:…' %} resolves on this site


def dashboard_view(request: HttpRequest, site: admin.AdminSite) -> TemplateResponse:
    """Queues, workers and the last hour's throughput; for those the jobs admin lets view jobs."""
    _check_view(request, site)
    context = {**site.each_context(request), "title": "Soniq dashboard",
               **dashboard_context(request, site)}
    return TemplateResponse(request, "admin/soniq_django/dashboard.html", context)


def dashboard_live_view(request: HttpRequest, site: admin.AdminSite) -> JsonResponse:
    """The dashboard's figures and module bodies as JSON; the same permission as the page."""
    _check_view(request, site)
    return live_response(request, site)


def dashboard_queue_view(request: HttpRequest, site: admin.AdminSite) -> HttpResponseBase:
    """POST ``queue`` and ``action`` (pause or resume), as the queue settings admin allows."""
    _check_view(request, site)
    return queue_action(request, site)


def add_dashboard(site: admin.AdminSite) -> None:
    """Serve the dashboard at ``<admin>/soniq_django/dashboard/`` on ``site``.

    Also its live endpoint (``dashboard/live/``) and the target of its
    Pause/Resume buttons (``dashboard/queue/``), and a "Dashboard" entry in
    the site's app list (``with_dashboard``): on the site index, the Soniq
    jobs app index and the navigation sidebar. Done for
    ``django.contrib.admin.site`` when ``soniq_django.admin`` is imported
    (by admin autodiscovery); call it for a custom ``AdminSite`` that
    registers these model admins. Calling it twice is harmless.
    """
    if getattr(site, "_soniq_dashboard", False):
        return
    site_urls = site.get_urls
    site_app_list = site.get_app_list

    def get_app_list(request: HttpRequest, app_label: str | None = None) -> list[dict[str, Any]]:
        return with_dashboard(request, site, site_app_list(request, app_label))

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
    site.get_app_list = get_app_list
    site._soniq_dashboard = True


def with_dashboard(request: HttpRequest, site: admin.AdminSite, app_list: list[dict[str, Any]]
                   ) -> list[dict[str, Any]]:
    """``app_list`` with the dashboard first among soniq's models, for a user who may view it.

    An entry shaped as Django's own model entries (a name, an admin URL,
    view only), so the site index, the app index and the navigation
    sidebar draw it as they draw a model: a link, and a "View" link. (A
    table of its own, with a long description in a cell the admin's
    ``dashboard.css`` keeps on one line, squeezed "Dashboard" to one letter
    a line.)
    """
    jobs = model_admin(site, Job)
    if jobs is None or not jobs.has_view_permission(request):
        return app_list
    for app in app_list:
        if app.get("app_label") == Job._meta.app_label:
            url = reverse("admin:soniq_django_dashboard", current_app=site.name)
            app["models"] = [{
                "model": None, "name": "Dashboard", "object_name": "Dashboard",
                "perms": {"add": False, "change": False, "delete": False, "view": True},
                "admin_url": url, "add_url": None, "view_only": True,
            }, *[model for model in app["models"] if model.get("object_name") != "Dashboard"]]
    return app_list
