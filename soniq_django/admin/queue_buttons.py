"""The dashboard's Pause and Resume buttons: a POST that calls ``flow.pause_queue``/``resume_queue``.

Needs the *change queue setting* permission (the one the queue settings
admin's own pause and resume actions need), writes to the routers' write
alias for ``QueueSetting``, and records what it did in the admin's log
(``LogEntry``, on the queue's settings row, so the row's History page
lists it).
"""

from django.contrib import messages
from django.contrib.admin.models import CHANGE, LogEntry
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponseBadRequest, HttpResponseBase, HttpResponseRedirect
from django.urls import reverse

from .. import flow
from ..errors import ConfigValidationError
from ..models import QueueSetting
from .base import write_alias

PERMISSION = "soniq_django.change_queuesetting"


def queue_action(request: HttpRequest, site_name: str) -> HttpResponseBase:
    """Pause or resume the queue named in the POST, then go back to the dashboard."""
    if not request.user.has_perm(PERMISSION):
        raise PermissionDenied
    action, name = request.POST.get("action"), request.POST.get("queue", "")
    if action not in ("pause", "resume"):
        return HttpResponseBadRequest("action must be pause or resume")
    using = write_alias(QueueSetting.objects.all())
    try:
        if action == "pause":
            changed = flow.pause_queue(name, by=request.user.get_username(), using=using)
        else:
            changed = flow.resume_queue(name, using=using)
    except ConfigValidationError as error:
        return HttpResponseBadRequest(error.reason)
    verb = "paused" if action == "pause" else "resumed"
    if changed:
        row = QueueSetting.objects.using(using).get(queue=name)
        LogEntry.objects.log_actions(
            user_id=request.user.pk, queryset=[row], action_flag=CHANGE,
            change_message=f"{verb.capitalize()} the queue from the dashboard.",
            single_object=True)
        messages.success(request, f"{verb.capitalize()} queue “{name}”.")
    else:
        messages.warning(request, f"Queue “{name}” was already {verb}: nothing changed.")
    return HttpResponseRedirect(reverse("admin:soniq_django_dashboard", current_app=site_name))
