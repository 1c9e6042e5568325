"""Template filters of the soniq admin's templates: ``{% load soniq_admin %}``."""

from django import template
from django.utils.safestring import SafeString

from ..admin.display import visible

register = template.Library()


@register.filter  # type: ignore[untyped-decorator]  # Django's, untyped here
def shown(value: str | None) -> str | SafeString:
    """A name as ``admin.display.visible`` shows it: hidden characters escaped and marked."""
    return visible(value)
