"""The dashboard's Pause and Resume buttons: a POST that calls ``flow.pause_queue``/``resume_queue``.

Allowed by the queue settings admin registered on the dashboard's own site,
as its own pages would allow it (access.py): a Pause needs that admin's
``has_change_permission`` for the queue's row, and, when the queue has no
row yet (a pause adds one), its ``has_add_permission`` too; a Resume needs
the change permission. Without that admin on the site the endpoint answers
404. It writes to the routers' write alias for ``QueueSetting``, and
records what it did in the admin's log (``LogEntry``, on the queue's
settings row, so the row's History page lists it).
"""

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponseBadRequest, HttpResponseBase
from django.http import HttpResponseRedirect
from django.urls import reverse

from .. import flow
from ..errors import ConfigValidationError
from ..models import QueueSetting
from .access import dashboard_access
from .base import write_alias


def queue_action(request: HttpRequest, site: admin.AdminSite) -> HttpResponseBase:
    """Pause or resume the queue named in the POST, then go back to the dashboard."""
    access = dashboard_access(request, site)
    if access.queue_admin is None:
        raise Http404("no queue settings admin on this site")
    action, name = request.POST.get("action"), request.POST.get("queue", "")
    if action not in ("pause", "resume"):
        return HttpResponseBadRequest("action must be pause or resume")
    try:
        name = flow.queue_name(name)
    except ConfigValidationError as error:
        return HttpResponseBadRequest(error.reason)
    using = write_alias(QueueSetting.objects.all())
    setting = QueueSetting.objects.using(using).filter(queue=name).only("queue", "paused").first()
    if action == "pause":
        allowed = access.may_pause(request, setting)
    else:
        allowed = bool(access.queue_admin.has_change_permission(request, setting))
    if not allowed:
        raise PermissionDenied
    try:
        if action == "pause":
            changed = flow.pause_queue(name, by=request.user.get_username(), using=using,
                                       create=bool(access.queue_admin.has_add_permission(request)))
        else:
            changed = flow.resume_queue(name, using=using)
    except ConfigValidationError as error:
        return HttpResponseBadRequest(error.reason)
    verb = "paused" if action == "pause" else "resumed"
    row = QueueSetting.objects.using(using).filter(queue=name).first()
    if changed and row is not None:
        LogEntry.objects.log_actions(
            user_id=request.user.pk, queryset=[row], action_flag=CHANGE,
            change_message=f"{verb.capitalize()} the queue from the dashboard.",
            single_object=True)
        messages.success(request, f"{verb.capitalize()} queue “{name}”.")
    elif row is None and action == "pause":
        messages.warning(request, f"Queue “{name}” has no settings row any more: nothing "
                                  "changed.")
    else:
        messages.warning(request, f"Queue “{name}” was already {verb}: nothing changed.")
    return HttpResponseRedirect(reverse("admin:soniq_django_dashboard", current_app=site.name))
