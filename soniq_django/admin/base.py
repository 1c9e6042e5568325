"""What every soniq admin shares: offered lookups only, read-only rows, listed columns only."""

from collections.abc import Iterable, Sequence
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin import FieldListFilter, ListFilter, SimpleListFilter
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import SuspiciousOperation
from django.db import router
from django.db.models import Model, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest, HttpResponseBase, HttpResponseRedirect

FENCE_COLUMNS = frozenset({
    "claim_token", "claim_owner", "claim_generation", "submission_id", "submission_fingerprint",
})
"""Columns of a claim or submission fence: never a changelist lookup, whatever an admin offers."""

ACTION_CAP = 10_000
"""The most rows one admin action changes in one request: ticked, "select all", or all matching."""

DATE_PARTS = {"year": range(2, 9999), "month": range(1, 13), "day": range(1, 32)}
"""What a date drill-down part may be: a year whose whole span (in any time zone) is a
datetime, a month, a day of a month. Anything else is refused with 400."""


def holds_nul(request: HttpRequest) -> bool:
    """Whether a name or value of the query string holds a NUL, which no database column can."""
    return any("\x00" in name or any("\x00" in value for value in values)
               for name, values in request.GET.lists())


class OfferedLookupsOnly:
    """Refuse every changelist URL lookup except those the admin's own filters make.

    Django's admin lets a changelist URL filter on any field of the model
    (``?claim_token__regex=^a``), so a user with only the view permission
    could learn a column the pages never show, one guess at a time. Here
    only the parameters of ``list_filter`` (each filter's
    ``expected_parameters()``, or a SimpleListFilter's ``parameter_name``)
    and of ``date_hierarchy`` (``<field>__year``, ``__month``, ``__day``)
    pass, and nothing that names a fence column ever does. Django answers
    a refused lookup with 400 Bad Request (DisallowedModelAdminLookup).
    Search (``q``), ordering (``o``) and paging are not lookups: they only
    reach ``search_fields`` and the listed columns.
    """

    # What the ModelAdmin this mixin goes with provides (for type checkers).
    date_hierarchy: Any
    list_filter: Any
    model: Any
    get_list_filter: Any

    def lookup_allowed(self, lookup: str, value: Any, request: HttpRequest | None = None
                       ) -> bool:
        if FENCE_COLUMNS & set(lookup.split(LOOKUP_SEP)):
            return False
        if isinstance(value, str) and "\x00" in value:
            return False  # PostgreSQL refuses the statement: 400, not 500
        if lookup not in self.offered_lookups(request):
            return False
        return self._date_part_allowed(lookup, value)

    def _date_part_allowed(self, lookup: str, value: Any) -> bool:
        """A drill-down part is a whole number in DATE_PARTS' range (Django's own check
        lets year 9999 through, and then fails computing the year's end: a 500)."""
        if not self.date_hierarchy or not lookup.startswith(f"{self.date_hierarchy}{LOOKUP_SEP}"):
            return True
        part = lookup.rsplit(LOOKUP_SEP, 1)[-1]
        text = str(value)
        return text.isascii() and text.isdigit() and len(text) <= 4 and (
            int(text) in DATE_PARTS[part])

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        """Django's, after refusing a NUL anywhere in the query string (a search term too)."""
        if holds_nul(request):
            # A query no page of the admin makes: Django answers 400.
            raise SuspiciousOperation("a NUL character in the query string")
        return super().get_changelist_instance(request)  # type: ignore[misc]

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        """Django's, except that an id holding a NUL names no row (PostgreSQL refuses it).

        The page then says the row does not exist, as for any id that names none.
        """
        if "\x00" in str(object_id):
            return None
        return super().get_object(request, object_id, from_field)  # type: ignore[misc]

    def offered_lookups(self, request: HttpRequest | None) -> frozenset[str]:
        """The query-string parameters this admin's filters and date drill-down produce."""
        offered: set[str] = set()
        if self.date_hierarchy:
            offered |= {f"{self.date_hierarchy}{LOOKUP_SEP}{part}"
                        for part in ("year", "month", "day")}
        list_filter = self.get_list_filter(request) if request is not None else self.list_filter
        for item in list_filter:
            if isinstance(item, type) and issubclass(item, SimpleListFilter):
                # Its parameter_name, without running its lookups():
                offered.add(item.parameter_name)  # type: ignore[attr-defined]
            elif isinstance(item, type) and issubclass(item, ListFilter):
                offered.update(item(request, {}, self.model, self).expected_parameters())
            else:
                field_path, filter_class = (
                    item if isinstance(item, (list, tuple)) else (item, FieldListFilter.create))
                field = get_fields_from_path(self.model, field_path)[-1]
                spec = filter_class(field, request, {}, self.model, self, field_path=field_path)
                offered.update(spec.expected_parameters())
        return frozenset(offered)


class CappedActions:
    """Refuse an action on more than ``action_cap`` rows, before it changes anything.

    Django's "Select all N" (``select_across``) hands an action every row the
    list's filters match, in one request; so can a POST that ticks a page of
    its own. Above the cap the action is not run: an error message, and back
    to the list. ``ACTION_CAP`` is the cap of the "all matching" operations
    too (matching.py); the count reads at most ``action_cap + 1`` rows.
    """

    action_cap = ACTION_CAP
    message_user: Any

    def response_action(self, request: HttpRequest, queryset: QuerySet
                        ) -> HttpResponseBase | None:
        across = forms.BooleanField(required=False).clean(request.POST.get("select_across"))
        if across:
            too_many = queryset[:self.action_cap + 1].count() > self.action_cap
        else:
            too_many = len(request.POST.getlist(ACTION_CHECKBOX_NAME)) > self.action_cap
        if too_many:
            self.message_user(request, (
                f"Nothing done: an action takes at most {self.action_cap:,} rows in one "
                "request. Narrow the list's filters, or use the management commands."),
                messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset)  # type: ignore[misc]


class ReadOnlyAdmin(CappedActions, OfferedLookupsOnly, admin.ModelAdmin):
    """Rows are shown, never added, edited or deleted through the admin."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class OnlyListedColumns(ChangeList):
    """A changelist that loads just the columns its rows show (``list_columns``)."""

    def get_queryset(self, request: HttpRequest, exclude_parameters: Any = None) -> QuerySet:
        queryset = super().get_queryset(request, exclude_parameters)
        return queryset.only(*self.model_admin.list_columns)


def write_alias(queryset: QuerySet) -> str:
    """The alias an admin action writes the selected rows to.

    The changelist read them from the routers' *read* alias (a replica,
    perhaps), where a write fails or is lost. An admin that pins its
    queryset with ``.using()`` keeps its alias; otherwise this is the
    routers' write alias for the model.
    """
    return queryset._db or router.db_for_write(queryset.model)



def check_limits(form: forms.BaseForm, data: dict[str, Any]) -> None:
    """Add ``form``'s errors for limits the claim cannot apply: a rate's count without its
    period (or the other way round), a concurrency, count or period below 1, a period over a
    day. The queue settings' form and the key limits' form share these rules."""
    if (data.get("rate_limit") is None) != (data.get("rate_period") is None):
        form.add_error("rate_period", "Set a rate's count and its period together, or neither.")
    for name in ("concurrency", "rate_limit", "rate_period"):
        value = data.get(name)
        if value is not None and value < 1:
            form.add_error(name, "Must be at least 1; leave it empty for no override.")
    period = data.get("rate_period")
    if period is not None and period > 86400:
        form.add_error("rate_period", "At most 86400 seconds (a day).")

REPR_COLUMNS: dict[str, tuple[str, ...]] = {
    "job": ("id", "job_name", "status"),
    "deadletterjob": ("id", "job_name", "dead_letter_reason"),
    "recurringjob": ("id", "job_name", "schedule_type", "schedule_value"),
    "queuesetting": ("queue",),
}
"""The columns each logged model's ``str()`` reads: all a log entry needs of a row."""


def log_rows(request: HttpRequest, rows: Sequence[Model], message: str, *,
             action_flag: int = CHANGE) -> None:
    """Record an operator's change of ``rows`` in the admin log, one entry a row.

    ``LogEntry.objects.log_actions``, as Django's own admin calls it: the
    rows' History pages and the admin's "Recent actions" list them, with
    the user. The entries go to the database the routers give ``LogEntry``
    (``default``, usually), in one insert, wherever the rows live; their
    object ids are text. ``message`` says what happened -- never a job's
    args.
    """
    if rows:
        LogEntry.objects.log_actions(user_id=request.user.pk, queryset=list(rows),
                                     action_flag=action_flag, change_message=message)


def log_changed(request: HttpRequest, model: type[Model], using: str, ids: Iterable[Any],
                message: str) -> None:
    """``log_rows`` for the rows of ``model`` with these ids, read in one query on ``using``.

    ``using`` is the alias the change was written to (a replica may lag
    behind it). A row gone meanwhile is still logged, on its id alone.
    """
    wanted = list(ids)
    if not wanted:
        return
    found = {row.pk: row for row in model._default_manager.using(using).filter(
        pk__in=wanted).only(*REPR_COLUMNS[model._meta.model_name or ""])}
    log_rows(request, [found.get(pk) or model(pk=pk) for pk in wanted], message)
