"""Operations on every row a changelist's filters match, not just the ticked page.

A list's "… all matching" button opens ``<changelist>/matching/<operation>/``
with the list's query string: the same filters, search and date drill-down,
checked the same way (a lookup no filter offers is refused with 400). The
page says how many rows match and asks for confirmation; the POST reads the
matching ids again, refuses more than ``matching_cap`` of them, and hands
them to the operation in batches of ``matching_batch``, each batch through
the same service the per-row action calls. After each batch the rows it
changed are recorded in the admin log (``LogEntry``, one insert a batch),
with the user and "(all matching)" in the message.
"""

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.contrib import messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ALL_VAR, PAGE_VAR
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import Http404, HttpRequest, HttpResponseBadRequest, HttpResponseBase
from django.http import HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse

from ..errors import SoniqError
from .base import ACTION_CAP, log_changed, write_alias

MATCHING_CAP = ACTION_CAP
"""The most rows one "all matching" operation takes; narrow the filter, or use the commands."""
MATCHING_BATCH = 500


@dataclass(frozen=True)
class Batch:
    """What an operation did to one batch: counts by outcome, and the ids it changed."""

    counts: Counter[str]
    changed: list[Any]


@dataclass(frozen=True)
class MatchingOperation:
    """One "all matching" operation of an admin."""

    label: str  # the button: "Replay all matching"
    verb: str  # the confirmation: "replay"
    noun: str  # what one row is: "dead letter"
    permission: str  # the admin's has_<permission>_permission decides
    run: Callable[[str, list[Any]], Batch]  # (write alias, ids) -> what it did
    summary: Callable[[Counter[str]], tuple[str, int]]  # counts -> (message, level)
    beyond_cap: str  # what to do instead when more rows than the cap match
    logged: Any  # the model whose rows a change is logged on (the ids are its pks)
    log_message: str  # the admin log's message for one changed row


class AllMatching:
    """Mix into a ModelAdmin (before it) and set ``matching_operations``."""

    matching_operations: dict[str, MatchingOperation] = {}
    matching_cap = MATCHING_CAP
    matching_batch = MATCHING_BATCH

    # What the ModelAdmin this mixin goes with provides (for type checkers).
    admin_site: Any
    model: Any
    opts: Any
    get_changelist_instance: Any
    message_user: Any

    def get_urls(self) -> list[Any]:
        info = (self.opts.app_label, self.opts.model_name)
        return [
            path("matching/<slug:operation>/",
                 self.admin_site.admin_view(self.matching_view),
                 name="{}_{}_matching".format(*info)),
            *super().get_urls(),  # type: ignore[misc]
        ]

    def changelist_view(self, request: HttpRequest, extra_context: Any = None
                        ) -> HttpResponseBase:
        tools = [(operation.label, self._matching_url(slug, request))
                 for slug, operation in self.matching_operations.items()
                 if self._may(request, operation)]
        return super().changelist_view(  # type: ignore[misc]
            request, {**(extra_context or {}), "matching_tools": tools})

    def _may(self, request: HttpRequest, operation: MatchingOperation) -> bool:
        return bool(getattr(self, f"has_{operation.permission}_permission")(request))

    def _matching_url(self, slug: str, request: HttpRequest) -> str:
        query = request.GET.copy()
        for name in (PAGE_VAR, ALL_VAR):
            query.pop(name, None)
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_matching",
                      args=[slug], current_app=self.admin_site.name)
        return f"{url}?{query.urlencode()}" if query else url

    def _changelist_url(self, request: HttpRequest) -> str:
        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_changelist",
                      current_app=self.admin_site.name)
        return f"{url}?{request.GET.urlencode()}" if request.GET else url

    def matching_queryset(self, request: HttpRequest) -> QuerySet:
        """The rows the changelist shows for this request's query string, on every page."""
        return self.get_changelist_instance(request).get_queryset(request)

    def matching_view(self, request: HttpRequest, operation: str) -> HttpResponseBase:
        chosen = self.matching_operations.get(operation)
        if chosen is None:
            raise Http404("no such operation")
        if not self._may(request, chosen):
            raise PermissionDenied
        try:
            queryset = self.matching_queryset(request)
        except IncorrectLookupParameters:
            return HttpResponseBadRequest("the list's filters are not valid")
        if request.method == "POST":
            return self._run(request, chosen, queryset)
        count = queryset.count()
        context = {
            **self.admin_site.each_context(request),
            "title": f"{chosen.label}?",
            "opts": self.opts, "operation": chosen, "count": count, "cap": self.matching_cap,
            "filters": sorted(request.GET.lists()),
            "changelist_url": self._changelist_url(request),
            "too_many": count > self.matching_cap,
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, "admin/soniq_django/matching_confirm.html", context)

    def _run(self, request: HttpRequest, operation: MatchingOperation, queryset: QuerySet
             ) -> HttpResponseBase:
        back = HttpResponseRedirect(self._changelist_url(request))
        ids = list(queryset.order_by("pk").values_list("pk", flat=True)[:self.matching_cap + 1])
        if len(ids) > self.matching_cap:
            self.message_user(request, (
                f"Nothing done: more than {self.matching_cap} {operation.noun}s match. "
                f"{operation.beyond_cap}"), messages.ERROR)
            return back
        using = write_alias(queryset)
        counts: Counter[str] = Counter()
        try:
            for start in range(0, len(ids), self.matching_batch):
                batch = operation.run(using, ids[start:start + self.matching_batch])
                counts += batch.counts
                log_changed(request, operation.logged, using, batch.changed,
                            f"{operation.log_message} (all matching).")
        except SoniqError as error:
            done, _ = operation.summary(counts)
            self.message_user(request, (
                f"Stopped by a database error: {error.reason}. Rows done before it stay done "
                f"(earlier batches: {done})"), messages.ERROR)
            return back
        message, level = operation.summary(counts)
        self.message_user(request, message, level)
        return back
