"""Small renderers shared by the soniq admin pages."""

import datetime as dt
import json
import uuid
from typing import Any

from django.utils import timezone
from django.utils.html import format_html

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
