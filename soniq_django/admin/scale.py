"""What keeps the job and dead-letter lists fast at a million rows (docs/admin.md).

- ``EstimatingPaginator``: a list counts its rows only when the planner
  expects that to be cheap (``estimates.count``); otherwise it shows the
  planner's estimate as "about N", and offers at most ``MAX_PAGES`` pages.
- ``EstimatedValuesFilter``: a filter by each value of a column lists the
  values ANALYZE saw when ``SELECT DISTINCT`` would read the whole table.
- ``search``: a search term is a job id, the start of one (a range of the
  primary key, never ``id::text LIKE``), ``key=value`` pairs found inside
  ``args`` (jsonb containment on PostgreSQL), or part of a name; every
  search but an id's reads at most the ``SEARCH_WINDOW`` newest rows.
- ``date_hierarchy``: the date drill-down, without reading every row's date
  when the list's count is an estimate.
"""

import calendar
import datetime as dt
import json
import re
import shlex
import uuid
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from django.contrib.admin.templatetags.admin_list import date_hierarchy as django_date_hierarchy
from django.core.paginator import Paginator
from django.db.models import Max, Min, Q, QuerySet
from django.db.models.fields.json import KeyTransform
from django.utils import formats, timezone
from django.utils.text import capfirst
from django.utils.translation import gettext as _

from .. import estimates
from .display import VisibleValuesFilter

MAX_PAGES = 200
"""Pages a list offers when its count is an estimate: deeper ones would skip that many rows."""

SEARCH_WINDOW = 100_000
"""The newest rows a search reads (an id's excepted): a search never reads the whole table."""

ESTIMATE_NOTE = ("Counts marked \"about\" are the database's estimates: counting every row "
                 "would read the whole table.")


class Estimate(int):
    """A row count that is the planner's estimate: a number, shown as "about N"."""

    def __str__(self) -> str:
        return f"about {int(self):,}"


class EstimatingPaginator(Paginator):
    """Django's paginator, counting with ``estimates.count`` (exact where it is cheap).

    ``exact`` counts in every case (a search: its rows are bounded by the
    search window). When the count is an estimate, ``count`` is an
    ``Estimate`` and at most MAX_PAGES pages are offered.
    """

    exact = False

    @cached_property
    def counted(self) -> estimates.Count:
        if self.exact:
            return estimates.Count(self.object_list.count(), estimated=False)
        return estimates.count(self.object_list)

    @cached_property
    def count(self) -> int:
        found = self.counted
        return Estimate(found.value) if found.estimated else found.value

    @property
    def estimated(self) -> bool:
        return self.counted.estimated

    @cached_property
    def num_pages(self) -> int:
        pages: int = super().num_pages
        return min(pages, MAX_PAGES) if self.estimated else pages


class ExactPaginator(EstimatingPaginator):
    exact = True


class EstimatedValuesFilter(VisibleValuesFilter):
    """A filter by each value of a column; on a big table, the values ANALYZE saw.

    ``SELECT DISTINCT`` reads every row when no index leads with the column.
    When the planner expects that to cost more than ``estimates.COST_LIMIT``,
    the choices are the column's values in ``pg_stats`` (a value rarer than
    one row in a few thousand may be missing; it can still be chosen in the
    URL), and the chosen value.
    """

    lookup_choices: Any  # Django's: a lazy SELECT DISTINCT; here, maybe the values' list

    def __init__(self, field: Any, request: Any, params: Any, model: Any, model_admin: Any,
                 field_path: str) -> None:
        super().__init__(field, request, params, model, model_admin, field_path)
        distinct: Any = self.lookup_choices
        if estimates.cheap(distinct):
            return
        seen = estimates.common_values(distinct.db, model, field.column)
        if seen is None:
            return
        chosen = [value for value in self.lookup_val or () if value not in seen]
        self.lookup_choices = sorted([*seen, *chosen])


# -- search ---------------------------------------------------------------------------

_HEX_PREFIX = re.compile(r"[0-9a-f]{8,31}")
_KEY = re.compile(r"[^\s=]+")


def id_range(term: str) -> tuple[uuid.UUID, uuid.UUID] | None:
    """The ids that start with ``term`` (8 to 31 hex digits, dashes ignored), first and last."""
    digits = term.strip().lower().replace("-", "")
    if not _HEX_PREFIX.fullmatch(digits):
        return None
    rest = 32 - len(digits)
    return uuid.UUID(digits + "0" * rest), uuid.UUID(digits + "f" * rest)


def args_pairs(term: str) -> dict[str, Any] | None:
    """``key=value`` pairs of a search term, or None when it is not made of them.

    A value is JSON when it parses as JSON (``order_id=42``, ``paid=true``,
    ``name="Ann Lee"``), else text (``customer=cust-42``).
    """
    try:
        words = shlex.split(term)
    except ValueError:
        return None
    pairs: dict[str, Any] = {}
    for word in words:
        key, sep, text = word.partition("=")
        if not sep or not _KEY.fullmatch(key):
            return None
        try:
            pairs[key] = json.loads(text)
        except ValueError:
            pairs[key] = text
    return pairs or None


def args_match(queryset: QuerySet, pairs: dict[str, Any]) -> QuerySet:
    """The rows whose args hold every pair (jsonb ``@>`` on PostgreSQL; key by key elsewhere)."""
    if estimates.estimating(queryset.db):
        return queryset.filter(args__contains=pairs)
    for number, (key, value) in enumerate(pairs.items()):
        name = f"_soniq_arg_{number}"
        queryset = queryset.alias(**{name: KeyTransform(key, "args")}).filter(**{name: value})
    return queryset


@dataclass(frozen=True)
class Window:
    """The rows a search read: those at or after ``since`` in ``field`` (None: all of them)."""

    field: str
    since: dt.datetime | None


def window(root: QuerySet, field: str) -> Window:
    """The SEARCH_WINDOW newest rows of ``root`` by ``field`` (an indexed timestamp)."""
    edge = list(root.order_by(f"-{field}").values_list(field, flat=True)
                [SEARCH_WINDOW - 1:SEARCH_WINDOW + 1])
    return Window(field, edge[0] if len(edge) > 1 else None)  # None: no row beyond it


def within(queryset: QuerySet, bound: Window) -> QuerySet:
    if bound.since is None:
        return queryset
    return queryset.filter(**{f"{bound.field}__gte": bound.since})


def window_note(bound: Window, noun: str) -> str:
    """What the page says when a search read only the window."""
    since = timezone.localtime(bound.since).strftime("%Y-%m-%d %H:%M:%S") if bound.since else ""
    return (f"The search read the newest {SEARCH_WINDOW:,} {noun} only (since {since}). "
            "Choose a date above the list to search older ones.")


def id_filter(term: str) -> Q | None:
    """The rows a term that is an id, or the start of one, names (None: not an id)."""
    try:
        return Q(pk=uuid.UUID(term.strip()))
    except ValueError:
        pass
    found = id_range(term)
    return None if found is None else Q(pk__range=found)


# -- the date drill-down ---------------------------------------------------------------

def date_hierarchy(cl: Any) -> dict[str, Any] | None:
    """Django's date drill-down, or, on a list too big to read, one that reads no row.

    Django's lists the years, months or days that hold rows, reading every
    row's date. When the list's count is an estimate, or a search read the
    search window only (``cl.dates_from_ends``), this one lists every period
    between the oldest and the newest row of the whole table (two reads of
    the index's ends), empty ones too.
    """
    if not getattr(cl, "dates_from_ends", False):
        return django_date_hierarchy(cl)
    field = cl.date_hierarchy
    year = cl.params.get(f"{field}__year")
    month = cl.params.get(f"{field}__month")
    day = cl.params.get(f"{field}__day")

    def link(filters: dict[str, Any]) -> str:
        return str(cl.get_query_string(filters, [f"{field}__"]))

    ends = cl.root_queryset.aggregate(first=Min(field), last=Max(field))
    if not (ends["first"] and ends["last"]):
        return None
    first, last = (timezone.localtime(ends[end]).date() for end in ("first", "last"))
    year, month, day = (_one(value) for value in (year, month, day))
    if not (year or month or day) and first.year == last.year:
        # As Django's: one year's rows open at its months, one month's at its days.
        year = first.year
        month = first.month if first.month == last.month else None
    if year and month and day:
        shown = dt.date(year, month, day)
        return {"show": True, "back": {
            "link": link({f"{field}__year": year, f"{field}__month": month}),
            "title": capfirst(formats.date_format(shown, "YEAR_MONTH_FORMAT"))},
            "choices": [{"title": capfirst(formats.date_format(shown, "MONTH_DAY_FORMAT"))}]}
    if year and month:
        days = [dt.date(year, month, d) for d in range(1, calendar.monthrange(year, month)[1] + 1)]
        return {"show": True, "back": {"link": link({f"{field}__year": year}), "title": str(year)},
                "choices": [{"link": link({f"{field}__year": year, f"{field}__month": month,
                                           f"{field}__day": d.day}),
                             "title": capfirst(formats.date_format(d, "MONTH_DAY_FORMAT"))}
                            for d in days if first <= d <= last]}
    if year:
        months = [dt.date(year, m, 1) for m in range(1, 13)]
        return {"show": True, "back": {"link": link({}), "title": _("All dates")},
                "choices": [{"link": link({f"{field}__year": year, f"{field}__month": m.month}),
                             "title": capfirst(formats.date_format(m, "YEAR_MONTH_FORMAT"))}
                            for m in months
                            if (first.year, first.month) <= (year, m.month)
                            <= (last.year, last.month)]}
    return {"show": True, "back": None,
            "choices": [{"link": link({f"{field}__year": str(y)}), "title": str(y)}
                        for y in range(first.year, last.year + 1)]}


def _one(value: Any) -> int | None:
    """A drill-down part from the query string (a list of one, on Django 5+), as a number."""
    if isinstance(value, list):
        value = value[-1] if value else None
    return int(value) if value else None
