"""Admin for ``soniq_queue_settings``: pause a queue, override its limits (docs/operations.md).

A plain form over the operator's columns. The configured ones are
``SONIQ["QUEUES"]`` as the workers wrote it: shown, never edited here, and
never written back by a save (a worker may rewrite them meanwhile).
"""

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.utils import timezone

from .. import flow
from ..errors import SoniqError
from ..models import QueueSetting
from .base import CappedActions, OfferedLookupsOnly, check_limits, log_changed, write_alias
from .display import plural, sentence, visible, when

_EDITED = ("paused", "concurrency", "rate_limit", "rate_period")


class QueueSettingForm(forms.ModelForm):
    class Meta:
        model = QueueSetting
        fields = ("queue", *_EDITED)
        widgets = {"queue": forms.TextInput(attrs={"size": 40,
                                                   "maxlength": flow.MAX_QUEUE_NAME})}

    def clean_queue(self) -> Any:
        """A name ``pause_queue`` and the claims accept: at most 255 characters, no NUL."""
        name = self.cleaned_data.get("queue")
        try:
            return flow.queue_name(name)
        except SoniqError as error:
            raise forms.ValidationError(f"Not a queue name: {error.reason}.") from None

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_limits(self, data)
        return data


def _rate(rate: tuple[int, int] | None) -> str:
    if rate is None:
        return "-"
    count, period = rate
    return f"{count} per {period} s"


@admin.register(QueueSetting)
class QueueSettingAdmin(CappedActions, OfferedLookupsOnly, admin.ModelAdmin):
    form = QueueSettingForm
    list_display = ("queue_name", "paused", "concurrency_applied", "rate_applied", "paused_by",
                    "paused_since", "updated")
    list_filter = ("paused",)
    search_fields = ("queue",)
    ordering = ("queue",)
    readonly_fields = ("configured", "paused_by", "paused_at", "updated_at")
    actions = ("pause_selected", "resume_selected")

    def get_readonly_fields(self, request: Any, obj: Any = None) -> Any:
        # The queue names the row: set when it is added, never renamed (shown as
        # queue_name shows it).
        return (*self.readonly_fields, "queue_name") if obj is not None else self.readonly_fields

    def get_fields(self, request: Any, obj: Any = None) -> Any:
        fields = super().get_fields(request, obj)
        if obj is None:
            return fields
        return ["queue_name", *(field for field in fields if field not in ("queue", "queue_name"))]

    @admin.display(description="queue", ordering="queue")
    def queue_name(self, obj: QueueSetting) -> Any:
        return visible(obj.queue)

    @admin.display(description="concurrency")
    def concurrency_applied(self, obj: QueueSetting) -> Any:
        return obj.effective_concurrency if obj.effective_concurrency is not None else "-"

    @admin.display(description="rate")
    def rate_applied(self, obj: QueueSetting) -> Any:
        return _rate(obj.effective_rate)

    @admin.display(description="paused since", ordering="paused_at")
    def paused_since(self, obj: QueueSetting) -> Any:
        return when(obj.paused_at)

    @admin.display(description="updated", ordering="updated_at")
    def updated(self, obj: QueueSetting) -> Any:
        return when(obj.updated_at)

    @admin.display(description="SONIQ['QUEUES'] (as the workers wrote it)")
    def configured(self, obj: QueueSetting) -> Any:
        concurrency = obj.configured_concurrency
        rate = (None if obj.configured_rate_limit is None
                else (obj.configured_rate_limit, obj.configured_rate_period))
        return (f"concurrency {concurrency if concurrency is not None else '-'}; "
                f"rate {_rate(rate)}")

    def save_model(self, request: Any, obj: QueueSetting, form: Any, change: bool) -> None:
        now = timezone.now()
        obj.updated_at = now
        fields = [name for name in form.changed_data if name in _EDITED]
        if "paused" in fields:
            obj.paused_at, obj.paused_by = (now, request.user.get_username()) if obj.paused \
                else (None, None)
            fields += ["paused_at", "paused_by"]
        if not change:
            obj.save()
        elif fields:
            # Only the edited columns: workers rewrite the configured ones meanwhile.
            obj.save(update_fields=[*fields, "updated_at"])
        if not obj.paused and ("paused" in fields or {"concurrency", "rate_limit"} & set(fields)):
            flow.wake_workers(write_alias(QueueSetting.objects.all()), obj.queue)

    @admin.action(description="Pause selected queues", permissions=["change"])
    def pause_selected(self, request: Any, queryset: Any) -> None:
        self._each(request, queryset, "paused", lambda name, using: flow.pause_queue(
            name, by=request.user.get_username(), using=using))

    @admin.action(description="Resume selected queues", permissions=["change"])
    def resume_selected(self, request: Any, queryset: Any) -> None:
        self._each(request, queryset, "resumed", lambda name, using: flow.resume_queue(
            name, using=using))

    def _each(self, request: Any, queryset: Any, verb: str, call: Any) -> None:
        """``call(name, using)`` for each selected queue, each change logged whatever happens.

        A name the call refuses (a row written by SQL with a name longer
        than a queue's, say) is reported and skipped; the queues changed
        before and after it stay changed, and are logged.
        """
        using = write_alias(queryset)
        names = list(queryset.values_list("queue", flat=True))
        changed, refused = [], []
        try:
            for name in names:
                try:
                    if call(name, using):
                        changed.append(name)
                except SoniqError as error:
                    refused.append(error.reason)
        finally:
            log_changed(request, QueueSetting, using, changed,
                        f"{verb.capitalize()} the queue from the admin.")
        unchanged = len(names) - len(changed) - len(refused)
        self.message_user(request, sentence(
            f"{verb} {plural(len(changed), 'queue')}",
            f"{unchanged} already {verb}" if unchanged else ""),
            messages.SUCCESS if changed or not refused else messages.WARNING)
        if refused:
            self.message_user(request, sentence(
                f"{plural(len(refused), 'queue')} not {verb}",
                f"{refused[0]}"), messages.ERROR)
