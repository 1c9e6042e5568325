"""What every soniq admin shares: offered lookups only, read-only rows, listed columns only."""

from collections.abc import Iterable, Sequence
from typing import Any

from django.contrib import admin
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.admin import FieldListFilter, ListFilter, SimpleListFilter
from django.contrib.admin.utils import get_fields_from_path
from django.contrib.admin.views.main import ChangeList
from django.db import router
from django.db.models import Model, QuerySet
from django.db.models.constants import LOOKUP_SEP
from django.http import HttpRequest

FENCE_COLUMNS = frozenset({
    "claim_token", "claim_owner", "claim_generation", "submission_id", "submission_fingerprint",
})
"""Columns of a claim or submission fence: never a changelist lookup, whatever an admin offers."""


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
        return lookup in self.offered_lookups(request)

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


class ReadOnlyAdmin(OfferedLookupsOnly, admin.ModelAdmin):
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
