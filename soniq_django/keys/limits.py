"""The operators' side of limits per key: overrides without a deploy, and the keys now.

``set_key_limit(queue, "tenant-42", concurrency=1)`` writes a row of
``soniq_key_limits`` (a key, or a pattern where ``*`` is any text) and
applies it at once: an offered job the new limit leaves no room for is
parked again, a key with room offers its next job (``soniq_key_refresh`` on
PostgreSQL, its twin here on SQLite). ``key_states`` is what ``soniq_queue
keys`` and the dashboard show: the keys at their limit, with their waiting
counts. See docs/keys.md.
"""

import re
from dataclasses import dataclass

from django.db import connections, router, transaction
from django.db.models import Count, F, Q

from ..errors import ConfigValidationError, ErrorCode, translating
from ..flow import MAX_LIMIT, parse_rate, queue_name
from .models import KEY_PARKED_AT, KeyLimit, KeyParked, KeySlot
from .options import check_key

__all__ = ["KeyState", "clear_key_limit", "key_states", "set_key_limit"]


def matches(key: str, pattern: str) -> bool:
    """Whether ``key`` matches ``pattern``, where ``*`` (only) stands for any text."""
    return re.fullmatch(".*".join(map(re.escape, pattern.split("*"))), key, re.DOTALL) is not None


def _alias(using: str | None) -> str:
    return using or router.db_for_write(KeySlot)


def _invalid(reason: str) -> ConfigValidationError:
    return ConfigValidationError(reason, code=ErrorCode.INVALID_OPTION)


def set_key_limit(queue: str, key_pattern: str, *, concurrency: int | None = None,
                  rate: str | None = None, using: str | None = None) -> int:
    """Override the limits of ``queue``'s keys matching ``key_pattern``; return the keys seen.

    ``concurrency`` None and ``rate`` None leave the jobs' declared limits in
    force (the row stays, changing nothing; ``clear_key_limit`` removes it).
    Raises ``ConfigValidationError(INVALID_OPTION)`` for a bad value.
    """
    queue = queue_name(queue)
    key_pattern = check_key(key_pattern, "key_pattern")
    if concurrency is not None and (type(concurrency) is not int
                                    or not 1 <= concurrency <= MAX_LIMIT):
        raise _invalid(f"concurrency must be a whole number from 1 to {MAX_LIMIT}, or None")
    count = period = None
    if rate is not None:
        try:
            count, period = parse_rate(rate)
        except ValueError as error:
            raise _invalid(f"rate: {error}") from None
    alias = _alias(using)
    with translating(alias), transaction.atomic(using=alias):
        KeyLimit.objects.using(alias).update_or_create(
            queue=queue, key_pattern=key_pattern,
            defaults={"concurrency": concurrency, "rate_limit": count, "rate_period": period})
        return refresh(queue, key_pattern, alias)


def clear_key_limit(queue: str, key_pattern: str, *, using: str | None = None) -> bool:
    """Remove an override; whether there was one. The jobs' declared limits apply again."""
    alias = _alias(using)
    with translating(alias), transaction.atomic(using=alias):
        deleted, _ = KeyLimit.objects.using(alias).filter(
            queue=queue, key_pattern=key_pattern).delete()
        refresh(queue, key_pattern, alias)
    return bool(deleted)


def refresh(queue: str, key_pattern: str, alias: str) -> int:
    """Apply the limits in force to ``queue``'s keys matching ``key_pattern`` now."""
    connection = connections[alias]
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT soniq_key_refresh(%s, %s)", [queue, key_pattern])
            seen: int = cursor.fetchone()[0]
        return seen
    return _refresh_portable(queue, key_pattern, alias)


def _refresh_portable(queue: str, key_pattern: str, alias: str) -> int:
    """``soniq_key_refresh`` for SQLite: an offered job without room parked again, then
    the admission (the trigger ``soniq_key_admit``, run by a write of ``pokes``)."""
    from ..models import Job

    slots = KeySlot.objects.using(alias).filter(queue=queue).order_by("key")
    seen = 0
    for slot in slots:
        if not matches(slot.key, key_pattern):
            continue
        seen += 1
        concurrency, rate = limits_in_force(slot, alias)
        if slot.head is not None and (rate is not None or (
                concurrency is not None and slot.running >= concurrency)):
            head = Job.objects.using(alias).filter(id=slot.head, status="queued")
            found = head.values_list("priority", "created_at").first()
            if found is not None:
                head.update(scheduled_at=KEY_PARKED_AT)
                KeyParked.objects.using(alias).get_or_create(
                    job_id=slot.head, defaults={"queue": queue, "key": slot.key,
                                                "priority": found[0], "created_at": found[1],
                                                "run_at": slot.head_run_at})
            KeySlot.objects.using(alias).filter(pk=slot.pk).update(head=None, head_run_at=None)
        KeySlot.objects.using(alias).filter(pk=slot.pk).update(pokes=F("pokes") + 1)
    return seen


def limits_in_force(slot: KeySlot, alias: str) -> tuple[int | None, tuple[int, int] | None]:
    """``(concurrency, (starts, per seconds))`` the admission applies to ``slot``'s key."""
    rows = [row for row in KeyLimit.objects.using(alias).filter(queue=slot.queue)
            if row.key_pattern == slot.key or matches(slot.key, row.key_pattern)]
    rows.sort(key=lambda row: (row.key_pattern == slot.key, len(row.key_pattern)), reverse=True)
    best = rows[0] if rows else None
    concurrency = (best.concurrency if best is not None and best.concurrency is not None
                   else slot.configured_concurrency)
    if best is not None and best.rate_limit is not None:
        return concurrency, (best.rate_limit, best.rate_period)
    if slot.configured_rate_limit is not None:
        return concurrency, (slot.configured_rate_limit, slot.configured_rate_period)
    return concurrency, None


@dataclass(frozen=True)
class KeyState:
    """One key of one queue as operators see it."""

    queue: str
    key: str
    running: int
    waiting: int
    """Its parked jobs (plus its offered one, if any)."""
    concurrency: int | None
    rate: tuple[int, int] | None
    at_limit: bool
    """Running at its concurrency with jobs waiting."""


def key_states(*, queue: str | None = None, at_limit_only: bool = False, limit: int = 100,
               using: str | None = None) -> list[KeyState]:
    """The keys with jobs running or waiting, busiest first (at most ``limit``)."""
    alias = using or router.db_for_read(KeySlot)
    slots = KeySlot.objects.using(alias).filter(Q(running__gt=0) | Q(head__isnull=False))
    parked = KeyParked.objects.using(alias)
    if queue is not None:
        slots, parked = slots.filter(queue=queue), parked.filter(queue=queue)
    waiting: dict[tuple[str, str], int] = {
        (row["queue"], row["key"]): row["n"]
        for row in parked.values("queue", "key").annotate(n=Count("job_id"))}
    keys = {(s.queue, s.key): s for s in slots}
    for pair in waiting:
        if pair not in keys:
            found = KeySlot.objects.using(alias).filter(queue=pair[0], key=pair[1]).first()
            if found is not None:
                keys[pair] = found
    states = []
    for (name, key), slot in keys.items():
        concurrency, rate = limits_in_force(slot, alias)
        count = waiting.get((name, key), 0) + (slot.head is not None)
        at_limit = count > 0 and concurrency is not None and slot.running >= concurrency
        if at_limit_only and not at_limit:
            continue
        states.append(KeyState(name, key, slot.running, count, concurrency, rate, at_limit))
    states.sort(key=lambda s: (not s.at_limit, -s.waiting, s.queue, s.key))
    return states[:limit]


def sweep_lapsed_holds(using: str, lock_wait: float | None = None) -> int:
    """Delete the lapsed holds that keep a key's slot (their slots are given back by the
    trigger); how many. The heartbeat's housekeeping calls it (``soniq_key_sweep``).

    On PostgreSQL the sweep waits for its keys' rows (in key order) at most
    ``lock_wait`` seconds each when given (a transaction-local
    ``lock_timeout``); past it, it raises QUEUE_PERSISTENCE_FAILED and
    nothing was deleted.
    """
    connection = connections[using]
    with translating(using):
        if connection.vendor == "postgresql":
            with transaction.atomic(using=using), connection.cursor() as cursor:
                if lock_wait is not None:
                    cursor.execute("SELECT pg_catalog.set_config('lock_timeout', %s, true)",
                                   [f"{max(1, round(lock_wait * 1000))}ms"])
                cursor.execute("SELECT soniq_key_sweep()")
                swept: int = cursor.fetchone()[0]
            return swept
        from django.utils import timezone

        from ..models import QueueHold
        from .models import KeyHold

        with transaction.atomic(using=using):
            held = set(KeyHold.objects.using(using).values_list("job_id", "generation"))
            lapsed = [hold.pk for hold in QueueHold.objects.using(using).filter(
                lease_expires_at__lte=timezone.now(), job_id__in=[j for j, _ in held])
                if (hold.job_id, hold.generation) in held]
            deleted: int = QueueHold.objects.using(using).filter(pk__in=lapsed).delete()[0]
        return deleted


def key_rate_poll(using: str, queues: list[str] | None) -> float | None:
    """How soon a worker should claim again for a key whose offered job waits for its rate's
    window: the shortest P/N of the keys with a rate that offer a job now, or None."""
    rows = KeySlot.objects.using(using).filter(head__isnull=False)
    if queues is not None:
        rows = rows.filter(queue__in=queues)
    found: list[float] = []
    for slot in rows[:100]:
        rate = limits_in_force(slot, using)[1]
        if rate is not None:
            found.append(rate[1] / rate[0])
    return min(found) if found else None
