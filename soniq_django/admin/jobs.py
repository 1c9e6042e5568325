"""Admins for ``soniq_jobs`` and ``soniq_dead_letter_jobs``: read-only lists, actions."""

from collections import Counter
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.models import DELETION
from django.contrib.admin.views.main import SEARCH_VAR
from django.contrib.auth import get_permission_codename
from django.db import router
from django.db.models import QuerySet
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html
from django.utils.translation import ngettext

from .. import operations, progress, replay
from ..errors import SoniqError
from ..models import DeadLetterJob, Job, JobStatus
from .access import may_view
from .base import OnlyListedColumns, ReadOnlyAdmin, log_changed, log_rows, write_alias
from .matching import AllMatching, Batch, MatchingOperation
from .page_actions import PageAction, PageActions
from .scale import EstimatedValuesFilter, EstimatingPaginator, ExactPaginator
from . import scale
from .timeline import dead_letter_events, error_summary, job_events, job_url, render_timeline
from .timeline import worker_link
from .display import plural, pre, pretty_json, sentence, visible, when
from .steps import render_steps
from .workflow import Links, render_workflow


class _RowsChangeList(OnlyListedColumns):
    """The listed columns only; ``result_estimated`` says whether the count is an estimate."""

    result_estimated = False
    dates_from_ends = False
    """Whether the date drill-down lists the periods between the table's ends (reads no row)."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_estimated = bool(getattr(self.paginator, "estimated", False))
        bound = getattr(request, "_soniq_search_window", None)
        self.dates_from_ends = self.result_estimated or (
            bound is not None and bound.since is not None)


class _JobRowAdmin(ReadOnlyAdmin):
    """What the job and dead-letter admins share: read-only rows, id search, pretty fields.

    At a million rows (docs/admin.md, "How the pages stay cheap on big
    tables"): counts are the planner's estimates where counting would read
    the whole table, the queue and job name filters list the values ANALYZE
    saw, and a search reads an id's range of the primary key, or at most the
    ``scale.SEARCH_WINDOW`` newest rows by ``search_window_field``.
    """

    list_columns: tuple[str, ...] = ()
    list_per_page = 50
    show_full_result_count = False  # no COUNT(*) over the whole table on every filter
    show_facets = admin.ShowFacets.NEVER  # "Show counts": a COUNT per filter value, a scan
    search_help_text = ("A job id (whole, or its first 8 or more characters), key=value "
                        "pairs inside its args, or part of a job name.")
    search_window_field = ""
    """An indexed timestamp: a search reads the newest rows by it (scale.SEARCH_WINDOW)."""
    search_noun = "rows"

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[OnlyListedColumns]:
        return _RowsChangeList

    def get_paginator(self, request: HttpRequest, queryset: QuerySet, per_page: int,
                      orphans: int = 0, allow_empty_first_page: bool = True
                      ) -> EstimatingPaginator:
        # A search's rows are bounded (an id's range, or the search window):
        # they are counted.
        searching = bool(request.GET.get(SEARCH_VAR, "").strip())
        kind = ExactPaginator if searching else EstimatingPaginator
        return kind(queryset, per_page, orphans, allow_empty_first_page)

    def changelist_view(self, request: HttpRequest, extra_context: Any = None
                        ) -> HttpResponseBase:
        response = super().changelist_view(request, extra_context)
        if isinstance(response, TemplateResponse) and response.context_data is not None:
            changelist = response.context_data.get("cl")
            notes = []
            if getattr(changelist, "result_estimated", False):
                notes.append(scale.ESTIMATE_NOTE)
            bound = getattr(request, "_soniq_search_window", None)
            if bound is not None and bound.since is not None:
                notes.append(scale.window_note(bound, self.search_noun))
            response.context_data["soniq_notes"] = notes
        return response

    def _has_model_permission(self, request: HttpRequest, action: str) -> bool:
        codename = get_permission_codename(action, self.opts)
        return request.user.has_perm(f"{self.opts.app_label}.{codename}")

    def get_search_results(self, request: HttpRequest, queryset: QuerySet, search_term: str
                           ) -> tuple[QuerySet, bool]:
        """An id or its start (a range of the primary key); else, in the search window,
        ``key=value`` pairs inside args, or part of a name (``search_fields``)."""
        term = search_term.strip()
        if not term:
            return queryset, False
        by_id = scale.id_filter(term)
        if by_id is not None:
            return queryset.filter(by_id), False
        bound = scale.window(self._window_root(request), self.search_window_field)
        request._soniq_search_window = bound  # for the note
        queryset = scale.within(queryset, bound)
        pairs = scale.args_pairs(term)
        if pairs is not None:
            return scale.args_match(queryset, pairs), False
        return super().get_search_results(request, queryset, search_term)

    def _window_root(self, request: HttpRequest) -> QuerySet:
        """The rows the search window counts back from: the list's date drill-down only.

        The list's other filters narrow the window's rows, never move the
        window: counting back through one queue's rows could read the table.
        """
        field = self.date_hierarchy
        dates = {name: value for name, value in request.GET.items()
                 if name in {f"{field}__year", f"{field}__month", f"{field}__day"}}
        return self.get_queryset(request).filter(**dates)

    @admin.display(description="id", ordering="id")
    def short_id(self, obj: Job | DeadLetterJob) -> str:
        return format_html('<span title="{}">{}</span>', obj.id, operations.short_id(obj.id))

    @admin.display(description="queue", ordering="queue")
    def queue_name(self, obj: Job | DeadLetterJob) -> str:
        return visible(obj.queue)

    @admin.display(description="attempts")
    def attempts_of_max(self, obj: Job | DeadLetterJob) -> str:
        return f"{obj.attempts}/{'-' if obj.max_attempts is None else obj.max_attempts}"

    @admin.display(description="args")
    def args_pretty(self, obj: Job | DeadLetterJob) -> str:
        return pretty_json(obj.args)

    @admin.display(description="last error")
    def last_error_pre(self, obj: Job | DeadLetterJob) -> str:
        return pre(obj.last_error)


# The admin log's messages: a selected-rows action ends them with ".", an
# all-matching operation with " (all matching)." (docs/admin.md, "What the
# admin log records"). Never a job's args.
RETRIED = "Made due now from the admin"
REPLAYED = "Replayed from the admin"
CANCELLED = "Cancelled from the admin"
CANCEL_REQUESTED = "Cancel requested from the admin: its worker was asked to stop it"
DELETED = "Deleted from the admin (a finished job)"


def _retry_now(using: str, ids: list[Any]) -> Batch:
    changed = operations.retry_now_ids(ids, using=using)
    return Batch(Counter(changed=len(changed), skipped=len(ids) - len(changed)), changed)


def _retry_summary(counts: Counter[str]) -> tuple[str, int]:
    changed, skipped = counts["changed"], counts["skipped"]
    return sentence(
        f"made {plural(changed, 'waiting job')} due now",
        f"skipped {skipped} not queued for later" if skipped else "",
    ), messages.SUCCESS if changed else messages.WARNING


def _replay(using: str, ids: list[Any]) -> Batch:
    report = replay.replay_dead_letters(using, ids=ids)
    # A replayed dead letter's change is the job it became (same id): that
    # row is what the log entry is on.
    return Batch(Counter(replayed=len(report.replayed), live=len(report.live),
                         already_replayed=len(report.already_replayed),
                         conflicts=len(report.conflicts), missing=len(report.missing)),
                 list(report.replayed))


def _replay_summary(counts: Counter[str]) -> tuple[str, int]:
    skipped = [
        f"{counts['live']} already in the queue" if counts["live"] else "",
        f"{counts['already_replayed']} replayed and not failed since"
        if counts["already_replayed"] else "",
        f"{counts['conflicts']} refused by a conflicting live job" if counts["conflicts"] else "",
        f"{counts['missing']} no longer dead-lettered" if counts["missing"] else "",
    ]
    message = f"Replayed {plural(counts['replayed'], 'dead letter')} into the queue."
    if any(skipped):
        message += " Skipped: " + "; ".join(item for item in skipped if item) + "."
    return message, messages.SUCCESS if counts["replayed"] else messages.WARNING


RETRY_ALL_MATCHING = MatchingOperation(
    label="Retry all matching now", verb="make due now", noun="job", permission="operate",
    run=_retry_now, summary=_retry_summary,
    beyond_cap="Narrow the filter (by queue, job name or date), or call operations.retry_now().",
    logged=Job, log_message=RETRIED)
REPLAY_ALL_MATCHING = MatchingOperation(
    label="Replay all matching", verb="replay", noun="dead letter", permission="replay",
    run=_replay, summary=_replay_summary,
    beyond_cap="Narrow the filter, or use manage.py soniq_replay --reason REASON (or --all).",
    logged=Job, log_message=REPLAYED)


_LIVE = (JobStatus.QUEUED, JobStatus.PROCESSING)

_CANCEL_MESSAGES = {
    "cancelled": lambda n: ngettext(
        "Cancelled %(count)d job.", "Cancelled %(count)d jobs.", n) % {"count": n},
    "requested": lambda n: ngettext(
        "Asked the worker of %(count)d running job to stop it.",
        "Asked the workers of %(count)d running jobs to stop them.", n) % {"count": n},
    "nothing": lambda n: ngettext(
        "Nothing to cancel for %(count)d job: it had finished, or is no longer there.",
        "Nothing to cancel for %(count)d jobs: they had finished, or are no longer there.",
        n) % {"count": n},
    "changed": lambda n: ngettext(
        "%(count)d job was not cancelled: its state changed meanwhile. Select it again.",
        "%(count)d jobs were not cancelled: their state changed meanwhile. Select them again.",
        n) % {"count": n},
}


def _cancel_outcome(status_before: str, row_after: tuple[str, bool] | None) -> str:
    """One job's outcome of a cancel: cancelled, requested, nothing (to cancel) or changed."""
    if status_before not in _LIVE:
        return "nothing"
    status, cancel_requested = row_after or (None, False)
    if status == JobStatus.CANCELLED:
        return "cancelled"
    if status == JobStatus.PROCESSING and cancel_requested:
        return "requested"
    if status in _LIVE:
        return "changed"  # e.g. a worker put it back in the queue meanwhile
    return "nothing"  # it finished meanwhile, or was deleted


def _is_live(dead: DeadLetterJob) -> bool:
    """Whether the dead letter's job is back in soniq_jobs (replayed, not failed since)."""
    using = dead._state.db or router.db_for_read(Job)
    return Job.objects.using(using).filter(id=dead.id).exists()


def _waits_for_later(job: Job) -> bool:
    return job.status == JobStatus.QUEUED and job.scheduled_at is not None and (
        job.scheduled_at > timezone.now())


@admin.register(Job)
class JobAdmin(PageActions, AllMatching, _JobRowAdmin):
    matching_operations = {"retry-now": RETRY_ALL_MATCHING}
    page_actions = (
        PageAction("cancel_selected", "Cancel", lambda job: job.status in _LIVE and not (
            job.status == JobStatus.PROCESSING and job.cancel_requested),
            "A queued job is cancelled; a running one's worker is asked to stop it"),
        PageAction("retry_selected_now", "Retry now", _waits_for_later,
                   "Make it due now instead of at its scheduled time"),
    )
    list_columns = ("id", "job_name", "queue", "status", "cancel_requested", "attempts",
                    "max_attempts", "priority", "scheduled_at", "updated_at")
    list_display = ("short_id", "job_name", "queue_name", "status_shown", "attempts_of_max",
                    "priority", "scheduled", "updated")
    list_filter = ("status", ("queue", EstimatedValuesFilter),
                   ("job_name", EstimatedValuesFilter))
    search_fields = ("job_name", "dedup_key")
    search_help_text = ("A job id (whole, or its first 8 or more characters), key=value pairs "
                        "inside its args (customer=42), or part of a job name or dedup key.")
    search_window_field = "created_at"
    search_noun = "jobs"
    date_hierarchy = "created_at"
    ordering = ("-created_at",)
    actions = ("cancel_selected", "retry_selected_now", "delete_selected_finished")
    fieldsets = (
        (None, {"fields": ("id", "job_name", "status_shown", "queue_name", "priority",
                           "attempts_of_max", "scheduled_at", "created_at", "updated_at",
                           "expires_at", "dead_letter_link")}),
        ("Timeline", {"fields": ("timeline",)}),
        ("Workflow", {"fields": ("workflow",)}),
        ("Steps", {"fields": ("steps_shown",)}),
        ("Arguments and outcome", {"fields": ("args_pretty", "progress_shown", "result_pretty",
                                              "last_error_pre")}),
        ("Producer and deduplication", {"fields": ("producer_id", "unique_job", "args_hash",
                                                   "dedup_key")}),
        ("Claim", {"fields": ("worker_shown", "claim_owner", "claim_generation", "claimed_at",
                              "lease_expires_at", "cancel_requested", "pid"),
                   "description": "The fence's secret claim token is never shown."}),
        ("Owned submission", {"fields": ("fence_required", "submission_id",
                                         "submission_fingerprint", "active_key"),
                              "classes": ("collapse",)}),
    )
    readonly_fields = (*(f for _, options in fieldsets for f in options["fields"]),
                       "timeline_without_dead_letter", "workflow_without_dead_letter")

    #: What a user the dead-letter admin refuses sees instead: no link to the dead letter,
    #: and a timeline without its reason, error and replays.
    WITHOUT_DEAD_LETTER = {"dead_letter_link": None, "timeline": "timeline_without_dead_letter",
                           "workflow": "workflow_without_dead_letter"}

    def get_queryset(self, request: HttpRequest) -> QuerySet:
        return super().get_queryset(request).defer("claim_token")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if may_view(request, self.admin_site, DeadLetterJob):
            return fieldsets
        swap = self.WITHOUT_DEAD_LETTER
        return [(name, {**options, "fields": tuple(
            swap.get(field, field) for field in options["fields"]
            if swap.get(field, field) is not None)}) for name, options in fieldsets]

    @admin.display(description="status", ordering="status")
    def status_shown(self, obj: Job) -> str:
        if obj.status == "processing" and obj.cancel_requested:
            return "processing (cancel requested)"
        return obj.get_status_display()

    @admin.display(description="scheduled for", ordering="scheduled_at")
    def scheduled(self, obj: Job) -> str:
        return when(obj.scheduled_at)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: Job) -> str:
        return when(obj.updated_at)

    @admin.display(description="worker")
    def worker_shown(self, obj: Job) -> str:
        return worker_link(obj.worker_id, None) if obj.worker_id else "-"

    @admin.display(description="result")
    def result_pretty(self, obj: Job) -> str:
        return pretty_json(obj.result)

    @admin.display(description="progress")
    def progress_shown(self, obj: Job) -> str:
        return progress_text(obj.id, self._using(obj))

    @admin.display(description="recorded steps")
    def steps_shown(self, obj: Job) -> str:
        return render_steps(obj.id, self._using(obj))

    @admin.display(description="dead letter")
    def dead_letter_link(self, obj: Job) -> str:
        if not DeadLetterJob.objects.using(self._using(obj)).filter(id=obj.id).exists():
            return "-"
        url = reverse("admin:soniq_django_deadletterjob_change", args=[obj.id])
        return format_html('<a href="{}">this job failed before: its dead letter</a>', url)

    @admin.display(description="timeline")
    def timeline(self, obj: Job) -> str:
        dead = DeadLetterJob.objects.using(self._using(obj)).filter(id=obj.id).first()
        return render_timeline(job_events(obj, dead))

    @admin.display(description="timeline")
    def timeline_without_dead_letter(self, obj: Job) -> str:
        return render_timeline(job_events(obj, dead_letters=False))

    @admin.display(description="workflow")
    def workflow(self, obj: Job) -> str:
        return render_workflow(obj.id, self._using(obj), Links(jobs=True, dead_letters=True))

    @admin.display(description="workflow")
    def workflow_without_dead_letter(self, obj: Job) -> str:
        return render_workflow(obj.id, self._using(obj), Links(jobs=True, dead_letters=False))

    @staticmethod
    def _using(obj: Job) -> str:
        return obj._state.db or router.db_for_read(type(obj))

    def has_operate_permission(self, request: HttpRequest) -> bool:
        return self._has_model_permission(request, "change")

    def has_purge_permission(self, request: HttpRequest) -> bool:
        return self._has_model_permission(request, "delete")

    @admin.action(description="Cancel selected jobs (running ones are asked to stop)",
                  permissions=["operate"])
    def cancel_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        using = write_alias(queryset)
        # The states before and after are both read where the cancel writes:
        # a replica the list came from may lag behind it.
        jobs = Job.objects.using(using).filter(id__in=list(queryset.values_list("id", flat=True)))
        before = {job_id: (status, cancel_requested) for job_id, status, cancel_requested in
                  jobs.values_list("id", "status", "cancel_requested")}
        report = operations.cancel_jobs(list(before), using=using)
        # What happened is read from the rows, not inferred from the status
        # before: the service may cancel a running job at once (its lease
        # had lapsed), and a worker may finish a job meanwhile.
        rows = {job.id: job for job in
                jobs.only("id", "job_name", "status", "cancel_requested")}
        outcome_of = {job_id: _cancel_outcome(
            before[job_id][0], (rows[job_id].status, rows[job_id].cancel_requested)
            if job_id in rows else None) for job_id in before}
        outcomes = Counter(outcome_of.values())
        # Logged: what this call did -- the service acted on the job, and
        # the row shows it cancelled, or newly asked to stop (asking again
        # changes nothing).
        acted = {job_id for job_id, result in report.outcomes if result != operations.SKIPPED}
        log_rows(request, [rows[job_id] for job_id in before if job_id in acted
                           and outcome_of[job_id] == "cancelled"], f"{CANCELLED}.")
        log_rows(request, [rows[job_id] for job_id in before if job_id in acted
                           and outcome_of[job_id] == "requested" and not before[job_id][1]],
                 f"{CANCEL_REQUESTED}.")
        for outcome, level in (("cancelled", messages.SUCCESS), ("requested", messages.SUCCESS),
                               ("nothing", messages.WARNING), ("changed", messages.WARNING)):
            if outcomes[outcome]:
                self.message_user(request, _CANCEL_MESSAGES[outcome](outcomes[outcome]), level)

    @admin.action(description="Retry selected jobs now (skip the wait)", permissions=["operate"])
    def retry_selected_now(self, request: HttpRequest, queryset: QuerySet) -> None:
        using = write_alias(queryset)
        batch = _retry_now(using, list(queryset.values_list("id", flat=True)))
        log_changed(request, Job, using, batch.changed, f"{RETRIED}.")
        self.message_user(request, *_retry_summary(batch.counts))

    @admin.action(description="Delete selected finished jobs (done or cancelled)",
                  permissions=["purge"])
    def delete_selected_finished(self, request: HttpRequest, queryset: QuerySet) -> None:
        ids = list(queryset.values_list("id", flat=True))
        rows = operations.delete_finished_rows(ids, using=write_alias(queryset))
        log_rows(request, rows, f"{DELETED}.", action_flag=DELETION)
        deleted = len(rows)
        self.message_user(request, sentence(
            f"deleted {plural(deleted, 'finished job')}",
            f"kept {len(ids) - deleted} that are queued, running or protected owned submissions"
            if len(ids) > deleted else "",
        ), messages.SUCCESS if deleted else messages.WARNING)


@admin.register(DeadLetterJob)
class DeadLetterJobAdmin(PageActions, AllMatching, _JobRowAdmin):
    matching_operations = {"replay": REPLAY_ALL_MATCHING}
    page_actions = (PageAction("replay_selected", "Replay", lambda dead: not _is_live(dead),
                               "Queue the job again under its own id"),)
    list_columns = ("id", "job_name", "queue", "dead_letter_reason", "attempts", "max_attempts",
                    "resurrection_count", "moved_to_dead_letter_at", "last_error")
    list_display = ("short_id", "job_name", "queue_name", "dead_letter_reason", "error_shown",
                    "attempts_of_max", "replays", "moved")
    list_filter = ("dead_letter_reason", ("queue", EstimatedValuesFilter),
                   ("job_name", EstimatedValuesFilter))
    search_fields = ("job_name",)
    search_window_field = "moved_to_dead_letter_at"
    search_noun = "dead letters"
    date_hierarchy = "moved_to_dead_letter_at"
    ordering = ("-moved_to_dead_letter_at",)
    actions = ("replay_selected",)
    fieldsets = (
        (None, {"fields": ("id", "job_name", "dead_letter_reason", "queue_name", "priority",
                           "attempts_of_max", "original_created_at", "moved_to_dead_letter_at",
                           "resurrection_count", "last_resurrection_at", "job_link")}),
        ("Timeline", {"fields": ("timeline",)}),
        ("Workflow", {"fields": ("workflow",)}),
        ("Steps", {"fields": ("steps_shown",)}),
        ("Arguments and error", {"fields": ("args_pretty", "progress_shown", "tags_pretty",
                                            "last_error_pre")}),
        ("Owned submission", {"fields": ("fence_required", "submission_id",
                                         "submission_fingerprint"), "classes": ("collapse",)}),
    )
    readonly_fields = (*(f for _, options in fieldsets for f in options["fields"]),
                       "workflow_without_jobs")

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if may_view(request, self.admin_site, Job):
            return fieldsets
        return [(name, {**options, "fields": tuple(
            "workflow_without_jobs" if field == "workflow" else field
            for field in options["fields"])}) for name, options in fieldsets]

    @admin.display(description="workflow")
    def workflow(self, obj: DeadLetterJob) -> str:
        return render_workflow(obj.id, obj._state.db or router.db_for_read(Job),
                               Links(jobs=True, dead_letters=True))

    @admin.display(description="workflow")
    def workflow_without_jobs(self, obj: DeadLetterJob) -> str:
        return render_workflow(obj.id, obj._state.db or router.db_for_read(Job),
                               Links(jobs=False, dead_letters=True))

    @admin.display(description="error")
    def error_shown(self, obj: DeadLetterJob) -> str:
        return error_summary(obj.last_error) or "-"

    @admin.display(description="replays", ordering="resurrection_count")
    def replays(self, obj: DeadLetterJob) -> int:
        return obj.resurrection_count

    @admin.display(description="dead-lettered", ordering="moved_to_dead_letter_at")
    def moved(self, obj: DeadLetterJob) -> str:
        return when(obj.moved_to_dead_letter_at)

    @admin.display(description="progress")
    def progress_shown(self, obj: DeadLetterJob) -> str:
        return progress_text(obj.id, obj._state.db or router.db_for_read(Job))

    @admin.display(description="recorded steps")
    def steps_shown(self, obj: DeadLetterJob) -> str:
        return render_steps(obj.id, obj._state.db or router.db_for_read(Job))

    @admin.display(description="tags")
    def tags_pretty(self, obj: DeadLetterJob) -> str:
        return pretty_json(obj.tags)

    @admin.display(description="job in the queue")
    def job_link(self, obj: DeadLetterJob) -> str:
        using = obj._state.db or router.db_for_read(Job)
        if not Job.objects.using(using).filter(id=obj.id).exists():
            return "-"
        url = reverse("admin:soniq_django_job_change", args=[obj.id])
        return format_html('<a href="{}">replayed: the job is in soniq_jobs again</a>', url)

    @admin.display(description="timeline")
    def timeline(self, obj: DeadLetterJob) -> str:
        using = obj._state.db or router.db_for_read(Job)
        live = Job.objects.using(using).filter(id=obj.id).exists()
        return render_timeline(dead_letter_events(obj, live),
                               job_url(obj.id) if live else None)

    def has_replay_permission(self, request: HttpRequest) -> bool:
        return self._has_model_permission(request, "change")

    @admin.action(description="Replay selected dead letters (queue them again)",
                  permissions=["replay"])
    def replay_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        using = write_alias(queryset)
        try:
            batch = _replay(using, list(queryset.values_list("id", flat=True)))
        except SoniqError as error:
            self.message_user(request, f"Replay stopped: {error.reason}. Dead letters replayed "
                                       "before the failure stay replayed.", messages.ERROR)
            return
        log_changed(request, Job, using, batch.changed, f"{REPLAYED}.")
        self.message_user(request, *_replay_summary(batch.counts))


def progress_text(job_id: Any, using: str) -> str:
    """The progress a job's handler last reported, as a line: "40 of 200 (20%) – note, at …"."""
    found = progress.read(job_id, using)
    if found is None:
        return "-"
    done, total = found["done"], found["total"]
    text = f"{done}" if total is None else f"{done} of {total}"
    if total:
        text += f" ({min(100, done * 100 // total)}%)"
    note = format_html(" - {}", visible(found["note"])) if found["note"] else ""
    return format_html("{}{}, reported {}", text, note, when(found["updated_at"]))
