"""Template filters of the soniq admin's templates: ``{% load soniq_admin %}``."""

from django import template
from django.contrib.admin.templatetags.base import InclusionAdminNode
from django.utils.safestring import SafeString

from ..admin.display import visible
from ..admin.scale import date_hierarchy

register = template.Library()


@register.filter  # type: ignore[untyped-decorator]  # Django's, untyped here
def shown(value: str | None) -> str | SafeString:
    """A name as ``admin.display.visible`` shows it: hidden characters escaped and marked."""
    return visible(value)


@register.tag(name="soniq_date_hierarchy")  # type: ignore[untyped-decorator]  # Django's, untyped
def soniq_date_hierarchy(parser: template.base.Parser, token: template.base.Token
                         ) -> InclusionAdminNode:
    """``{% soniq_date_hierarchy cl %}``: Django's date drill-down, or, when the list's count
    is an estimate, one that reads no row's date (``admin.scale.date_hierarchy``)."""
    return InclusionAdminNode(parser, token, func=date_hierarchy,
                              template_name="date_hierarchy.html", takes_context=False)
