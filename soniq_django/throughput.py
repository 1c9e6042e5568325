"""Per-minute throughput counts, kept by workers for the dashboard."""

import datetime as dt
import threading
import time
from collections import Counter

from django.db import connections, transaction
from django.utils import timezone

from .models import ThroughputMinute

KINDS = ("done", "failed", "dead_lettered", "cancelled")


def minute_of(moment: dt.datetime) -> dt.datetime:
    return moment.replace(second=0, microsecond=0)


class ThroughputCounter:
    """Counts outcomes in memory; ``flush`` adds them to ``soniq_throughput``."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[dt.datetime, str, str]] = Counter()
        self._lock = threading.Lock()
        # The current minute, read from the clock once a minute rather than once a job:
        # (the epoch second it ends at, minute_of(timezone.now()) during it).
        self._minute: tuple[float, dt.datetime] = (0.0, minute_of(timezone.now()))

    def add(self, queue: str, kind: str, when: dt.datetime | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"unknown outcome {kind!r}")
        minute = minute_of(when) if when is not None else self._now()
        with self._lock:
            self._counts[(minute, queue, kind)] += 1

    def _now(self) -> dt.datetime:
        """``minute_of(timezone.now())``, built once per minute (every UTC offset in use is
        a whole number of minutes, so a local minute ends when the UTC one does)."""
        ends, minute = self._minute
        now = time.time()
        if now >= ends:
            minute = minute_of(timezone.now())
            self._minute = (now - now % 60 + 60, minute)
        return minute

    def flush(self, using: str) -> None:
        """Add the counts to the table (one upsert per minute and queue); keep them on failure."""
        with self._lock:
            counts, self._counts = self._counts, Counter()
        rows: dict[tuple[dt.datetime, str], dict[str, int]] = {}
        for (minute, queue, kind), number in counts.items():
            rows.setdefault((minute, queue), dict.fromkeys(KINDS, 0))[kind] += number
        try:
            with transaction.atomic(using=using):
                for (minute, queue), numbers in rows.items():
                    _add(using, minute, queue, numbers)
        except Exception:
            with self._lock:
                self._counts.update(counts)
            raise


def _add(using: str, minute: dt.datetime, queue: str, numbers: dict[str, int]) -> None:
    connection = connections[using]
    table = ThroughputMinute._meta.db_table
    columns = ", ".join(KINDS)
    increments = ", ".join(f"{kind} = {table}.{kind} + EXCLUDED.{kind}" for kind in KINDS)
    minute_value = ThroughputMinute._meta.get_field("minute").get_db_prep_value(
        minute, connection
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (minute, queue, {columns}) VALUES (%s, %s, %s, %s, %s, %s) "
            f"ON CONFLICT (minute, queue) DO UPDATE SET {increments}",
            [minute_value, queue, *(numbers[kind] for kind in KINDS)],
        )


def per_minute(using: str, since: dt.datetime) -> dict[dt.datetime, dict[str, int]]:
    """Totals over all queues per minute since ``since``: {minute: {kind: count}}."""
    totals: dict[dt.datetime, dict[str, int]] = {}
    for row in ThroughputMinute.objects.using(using).filter(minute__gte=minute_of(since)):
        bucket = totals.setdefault(row.minute, dict.fromkeys(KINDS, 0))
        for kind in KINDS:
            bucket[kind] += getattr(row, kind)
    return totals
