"""Small renderers shared by the soniq admin pages."""

import datetime as dt
import json
import unicodedata
import uuid
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import escape, format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe

SHOWN_CHARACTERS = 20_000
"""Longer args, results and tracebacks are cut on the page (the row keeps them whole)."""


def plural(count: int, noun: str) -> str:
    """"1 job", "2 jobs"."""
    return f"{count} {noun}{'' if count == 1 else 's'}"


def pre(text: str | None) -> str:
    """``text`` escaped in a <pre> block, cut at SHOWN_CHARACTERS."""
    if text is None:
        return "-"
    if len(text) > SHOWN_CHARACTERS:
        cut = len(text) - SHOWN_CHARACTERS
        text = f"{text[:SHOWN_CHARACTERS]}\n… ({cut} more characters not shown)"
    return format_html(
        '<pre style="white-space: pre-wrap; max-height: 30em; overflow: auto; margin: 0">{}</pre>',
        text,
    )


def sentence(*parts: str) -> str:
    """The non-empty parts, joined into one sentence."""
    text = "; ".join(part for part in parts if part)
    return f"{text[:1].upper()}{text[1:]}."


def when(value: dt.datetime | None) -> str:
    """A compact local time for list columns, kept on one line."""
    if value is None:
        return "-"
    shown = timezone.localtime(value).strftime("%Y-%m-%d %H:%M:%S")
    return format_html('<span style="white-space: nowrap">{}</span>', shown)


def pretty_json(value: Any) -> str:
    """``value`` as indented JSON, escaped, in a <pre> block."""
    return pre(None if value is None else json.dumps(value, indent=2, ensure_ascii=False))


def parse_uuid(term: str) -> uuid.UUID | None:
    """``term`` as a UUID when it is one (any spelling ``uuid.UUID`` accepts), else None."""
    try:
        return uuid.UUID(term.strip())
    except ValueError:
        return None


_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Co", "Cn", "Cs", "Zl", "Zp", "Zs"})
"""Controls, formats (bidi overrides, zero-width characters), unassigned and private code
points, and every space but U+0020: characters a reader cannot see, or that reorder the
text around them."""
_HIDDEN_LETTERS = frozenset({0x034F, 0x115F, 0x1160, 0x17B4, 0x17B5, 0x2800, 0x3164, 0xFFA0})
"""Letters and marks that draw nothing (fillers, the combining grapheme joiner, a blank)."""
MARKED_TITLE = ("This name holds characters that are invisible or change the direction of "
                "the text; each is shown as its code point")


def _hidden(char: str) -> bool:
    code = ord(char)
    return char != " " and (unicodedata.category(char) in _HIDDEN_CATEGORIES
                            or code in _HIDDEN_LETTERS or 0xFE00 <= code <= 0xFE0F
                            or 0xE0100 <= code <= 0xE01EF)


def _code_point(char: str) -> str:
    code = ord(char)
    return f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def visible(text: str | None) -> str | SafeString:
    """``text`` as a reader can tell it apart: a name such as a queue's, for a page.

    A name with no hidden character comes back as it is (the page escapes
    it). One with a right-to-left override, a zero-width or other invisible
    character, or a space other than U+0020, comes back escaped and marked:
    each such character written as its code point (``\\u202e``) in a
    ``<mark>`` whose title names it, the whole in a span whose title says
    why. So "emails" and "emails" with a hidden character never look alike,
    and a bidi override cannot reorder the page around it.
    """
    if text is None:
        return "-"
    if not any(_hidden(char) for char in text):
        return text
    pieces = [format_html('<mark title="{}">{}</mark>',
                          f"U+{ord(char):04X} {unicodedata.name(char, 'unnamed')}",
                          _code_point(char))
              if _hidden(char) else escape(char) for char in text]
    return format_html('<span class="soniq-marked" title="{}">{}</span>', MARKED_TITLE,
                       mark_safe("".join(pieces)))  # noqa: S308 - each piece is escaped


def visible_list(names: list[str] | tuple[str, ...]) -> str:
    """Names joined with ", ", each as ``visible`` shows it."""
    return format_html_join(", ", "{}", ((visible(name),) for name in names))


class VisibleValuesFilter(admin.AllValuesFieldListFilter):
    """Django's filter by each value of a column, with each value drawn as ``visible`` shows it."""

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            display = choice.get("display")
            yield {**choice, "display": visible(display) if isinstance(display, str) else display}
