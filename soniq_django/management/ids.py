"""Job ids as operators type them into commands: whole, or the short form the admin shows.

``soniq_replay`` and ``soniq_cancel`` take either a whole id or its first
``operations.SHORT_ID_LENGTH`` (8) hex digits or more, as the admin lists
ids. Every id given must stand for exactly one row; otherwise the command
refuses before it changes anything, saying for each id given what is wrong.
"""

import uuid
from collections.abc import Iterable

from django.core.management.base import CommandError
from django.db.models import QuerySet

from ..errors import translating
from ..operations import SHORT_ID_LENGTH, match_ids


def resolve_ids(rows: QuerySet, texts: Iterable[str], *, kind: str, kinds: str
                ) -> list[uuid.UUID]:
    """The one id among ``rows`` that each of ``texts`` stands for, in order, without repeats.

    ``kind``/``kinds`` name the rows in messages ("dead letter"/"dead
    letters"). Raises ``CommandError`` listing every text that is not an id
    or a long enough prefix, matches no row, or matches more than one (with
    how many); the ``SoniqError`` of a database failure.
    """
    resolved: list[uuid.UUID] = []
    problems: list[str] = []
    with translating():
        matches = match_ids(rows, texts)
    for match in matches:
        shown = match.text.strip()
        if not match.valid:
            problems.append(f"{shown!r} is neither a job id nor its first {SHORT_ID_LENGTH} or "
                            "more hex digits (as the admin shows ids)")
        elif match.count == 0:
            problems.append(f"no {kind} has the id {shown}")
        elif match.count > 1:
            problems.append(f"{shown} is the start of {match.count} {kinds}' ids: give more of "
                            "the id")
        elif match.ids[0] not in resolved:
            resolved.append(match.ids[0])
    if problems:
        raise CommandError("; ".join(problems) + ". Nothing was changed.")
    return resolved
