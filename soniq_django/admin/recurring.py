"""Admin for ``soniq_recurring_jobs``: the one soniq table edited through a form."""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from .. import operations
from ..errors import ErrorCode, SoniqError
from ..producer.request import JobRequest, prepare
from ..models import RecurringJob
from ..periodic_jobs import Timing, code_schedules
from .base import CappedActions, OfferedLookupsOnly, log_changed, write_alias
from .display import VisibleValuesFilter, plural, sentence, visible, when


class RecurringJobForm(forms.ModelForm):
    """Checks a schedule as the scheduler will read it, and its job as enqueue will."""

    class Meta:
        model = RecurringJob
        fields = ("job_name", "schedule_type", "schedule_value", "job_kwargs", "status", "queue",
                  "priority", "max_attempts")
        widgets = {name: forms.TextInput(attrs={"size": 40})
                   for name in ("job_name", "schedule_value", "queue")}
        help_texts = {
            "schedule_value": "Interval: whole seconds, e.g. 900. Cron: five fields in UTC, "
                              "e.g. */5 * * * *.",
            "job_kwargs": "The job's args: a JSON object.",
        }

    _FIELD_OF_CODE = {
        ErrorCode.INVALID_TASK_NAME: "job_name",
        ErrorCode.TASK_ARGS_INVALID: "job_kwargs",
        ErrorCode.INVALID_MAX_ATTEMPTS: "max_attempts",
    }

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        kind, value = data.get("schedule_type"), data.get("schedule_value")
        if kind and value is not None:
            try:
                data["schedule_value"] = Timing.parse(kind, value).value
            except ValueError as error:
                self.add_error("schedule_value", str(error))
        if data.get("job_name") and "job_kwargs" in data:
            try:
                prepare(JobRequest(data["job_name"], data["job_kwargs"], queue=data.get("queue"),
                                   priority=data.get("priority"),
                                   max_attempts=data.get("max_attempts")))
            except SoniqError as error:
                self.add_error(self._FIELD_OF_CODE.get(error.code), error.reason)
        return data


@admin.register(RecurringJob)
class RecurringJobAdmin(CappedActions, OfferedLookupsOnly, admin.ModelAdmin):
    form = RecurringJobForm
    list_display = ("job_name", "schedule", "status", "queue_name", "priority", "next_run_at",
                    "last_run_at", "run_count", "defined_in_code")
    list_filter = ("status", "schedule_type", ("queue", VisibleValuesFilter))
    search_fields = ("job_name",)
    ordering = ("job_name",)
    readonly_fields = ("next_run", "last_run", "run_count", "last_job_id")
    actions = ("pause_selected", "resume_selected")

    @admin.display(description="schedule")
    def schedule(self, obj: RecurringJob) -> str:
        if obj.schedule_type == "interval":
            return f"every {obj.schedule_value} s"
        return f"cron {obj.schedule_value}"

    @admin.display(description="queue", ordering="queue")
    def queue_name(self, obj: RecurringJob) -> str:
        return visible(obj.queue) if obj.queue else "-"

    @admin.display(description="next run", ordering="next_run")
    def next_run_at(self, obj: RecurringJob) -> str:
        return when(obj.next_run)

    @admin.display(description="last run", ordering="last_run")
    def last_run_at(self, obj: RecurringJob) -> str:
        return when(obj.last_run)

    @admin.display(description="in code", boolean=True)
    def defined_in_code(self, obj: RecurringJob) -> bool:
        return obj.job_name in code_schedules()

    def save_model(self, request: HttpRequest, obj: RecurringJob, form: Any, change: bool) -> None:
        if not change:
            obj.save()
        else:
            # Only the edited columns: the scheduler updates next_run,
            # last_run and run_count meanwhile, and they must not be undone.
            fields = [name for name in form.changed_data if name in form.Meta.fields]
            if {"schedule_type", "schedule_value"} & set(fields):
                obj.next_run = None  # the scheduler works it out again from the new timing
                fields.append("next_run")
            if fields:
                obj.save(update_fields=fields)
        if obj.job_name in code_schedules():
            self.message_user(request, (
                f"{obj.job_name} is scheduled in code with @periodic: the scheduler writes the "
                "code's schedule back over this row when it starts."
            ), messages.WARNING)

    @admin.action(description="Pause selected schedules", permissions=["change"])
    def pause_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_status(request, queryset, "paused")

    @admin.action(description="Resume selected schedules", permissions=["change"])
    def resume_selected(self, request: HttpRequest, queryset: QuerySet) -> None:
        self._set_status(request, queryset, "active")

    def _set_status(self, request: HttpRequest, queryset: QuerySet, status: str) -> None:
        ids = list(queryset.values_list("id", flat=True))
        using = write_alias(queryset)
        changed = operations.set_schedule_status_ids(ids, status, using=using)
        verb = "paused" if status == "paused" else "resumed"
        log_changed(request, RecurringJob, using, changed,
                    f"{verb.capitalize()} the schedule from the admin.")
        self.message_user(request, sentence(
            f"{verb} {plural(len(changed), 'schedule')}",
            f"{len(ids) - len(changed)} already {status}" if len(ids) > len(changed) else "",
        ))
