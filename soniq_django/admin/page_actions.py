"""A job's and a dead letter's own page carries the actions of their lists, as buttons.

Each button posts to ``<change page>/act/<action>/``. The view runs the very
admin action the list offers (same permission checks: the action must be
among ``get_actions(request)``, which Django filters by the action's
``allowed_permissions``; same service, messages and admin log entry) on
that one row, then returns to the page. A button is shown only when the
user may run it and the row is in a state where it does something.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponseBase, HttpResponseNotAllowed
from django.http import HttpResponseRedirect
from django.urls import path, reverse
from django.utils.html import escape


@dataclass(frozen=True)
class PageAction:
    """One button: the list action it runs, its label, and when the row offers it."""

    action: str  # the admin action's name: "cancel_selected"
    label: str  # the button: "Cancel"
    offered: Callable[[Any], bool]  # the row -> whether the action does something to it
    title: str = ""  # the button's tooltip


class PageActions:
    """Mix into a ModelAdmin (before it) and set ``page_actions``."""

    page_actions: tuple[PageAction, ...] = ()

    # What the ModelAdmin this mixin goes with provides (for type checkers).
    admin_site: Any
    opts: Any
    get_actions: Any
    get_object: Any
    get_queryset: Any

    def get_urls(self) -> list[Any]:
        info = (self.opts.app_label, self.opts.model_name)
        return [
            path("<path:object_id>/act/<slug:action>/",
                 self.admin_site.admin_view(self.page_action_view),
                 name="{}_{}_page_action".format(*info)),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def offered_page_actions(self, request: HttpRequest, obj: Any) -> list[dict[str, str]]:
        """The buttons for ``obj``'s page: label, tooltip and where each posts."""
        if obj is None:
            return []
        allowed = self.get_actions(request)
        name = f"admin:{self.opts.app_label}_{self.opts.model_name}_page_action"
        return [{"label": item.label, "title": item.title,
                 "url": reverse(name, args=[obj.pk, item.action])}
                for item in self.page_actions if item.action in allowed and item.offered(obj)]

    def change_view(self, request: HttpRequest, object_id: str, form_url: str = "",
                    extra_context: dict[str, Any] | None = None) -> HttpResponseBase:
        obj = self.get_object(request, object_id)
        context = {**(extra_context or {}),
                   "soniq_page_actions": self.offered_page_actions(request, obj)}
        return super().change_view(  # type: ignore[misc]
            request, object_id, form_url, extra_context=context)

    def page_action_view(self, request: HttpRequest, object_id: str,
                         action: str) -> HttpResponseBase:
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        if action not in {item.action for item in self.page_actions}:
            raise Http404("no such action on this page")
        actions = self.get_actions(request)
        if action not in actions:
            raise PermissionDenied
        obj = self.get_object(request, object_id)
        if obj is None:
            raise Http404(f"no {escape(self.opts.verbose_name)} with this id")
        function = actions[action][0]
        function(self, request, self.get_queryset(request).filter(pk=obj.pk))
        info = (self.opts.app_label, self.opts.model_name)
        return HttpResponseRedirect(reverse("admin:{}_{}_change".format(*info), args=[obj.pk]))
