"""Admin for limits per key: an operator's overrides, and the keys as they stand (docs/keys.md).

``soniq_key_limits`` rows are added and edited here (a key, or a pattern
where ``*`` is any text); a save or a deletion applies at once through
``keys.limits.refresh``, the same service ``soniq_queue limit-key`` calls.
``soniq_key_slots`` is shown read-only: each key's running count and the
job it offers.
"""

from typing import Any

from django import forms
from django.contrib import admin

from ..errors import SoniqError
from ..keys import limits
from ..keys.models import KeyLimit, KeySlot
from .base import OfferedLookupsOnly, ReadOnlyAdmin, check_limits, write_alias


class KeyLimitForm(forms.ModelForm):
    class Meta:
        model = KeyLimit
        fields = ("queue", "key_pattern", "concurrency", "rate_limit", "rate_period")

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        check_limits(self, data)
        for name in ("queue", "key_pattern"):
            value = data.get(name)
            if value is not None and (not 0 < len(value) <= 255 or "\x00" in value):
                self.add_error(name, "1 to 255 characters, without NUL.")
        return data


@admin.register(KeyLimit)
class KeyLimitAdmin(OfferedLookupsOnly, admin.ModelAdmin):
    form = KeyLimitForm
    list_display = ("queue", "key_pattern", "concurrency", "rate_limit", "rate_period",
                    "updated_at")
    search_fields = ("key_pattern",)
    ordering = ("queue", "key_pattern")
    readonly_fields = ("updated_at",)

    def save_model(self, request: Any, obj: KeyLimit, form: Any, change: bool) -> None:
        alias = write_alias(KeyLimit.objects.all())
        super().save_model(request, obj, form, change)
        try:
            limits.refresh(obj.queue, obj.key_pattern, alias)
        except SoniqError:  # saved; applied at the key's next move
            self.message_user(request, "Saved; it applies at each key's next claim or end.")

    def delete_model(self, request: Any, obj: KeyLimit) -> None:
        alias = write_alias(KeyLimit.objects.all())
        queue, pattern = obj.queue, obj.key_pattern
        super().delete_model(request, obj)
        limits.refresh(queue, pattern, alias)


@admin.register(KeySlot)
class KeySlotAdmin(ReadOnlyAdmin):
    list_display = ("queue", "key", "running", "head", "configured_concurrency",
                    "configured_rate_limit", "configured_rate_period", "updated_at")
    search_fields = ("key",)
    ordering = ("-running", "queue", "key")
    exclude = ("pokes",)
