"""The tables of limits per key (migration 0029): not part of format 1.

A keyed job is a ``soniq_jobs`` row with ``concurrency_key`` set. While
it is held back it is *parked*: queued at ``KEY_PARKED_AT`` (no claim
reaches it) with a row here in ``soniq_key_parked``. Each key offers one
job to the claims at a time, its head; the triggers of
sql/claim_protocol_v12.sql (SQLite: sql/sqlite/claim_protocol_v12.sql)
keep the counts as the job rows move. See docs/keys.md and
docs/decisions/0047-limits-per-key.md.
"""

import datetime as dt

from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

#: The ``scheduled_at`` of a parked keyed job: 9999-01-01 UTC, as a job waiting on its
#: dependencies (models.WAITING_SCHEDULED_AT): a time no claim reaches.
KEY_PARKED_AT = dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)

_RATE_VALID = ((Q(rate_limit__isnull=True) & Q(rate_period__isnull=True))
               | (Q(rate_limit__gte=1) & Q(rate_period__gte=1) & Q(rate_period__lte=86400)))


class KeySlot(models.Model):
    """``soniq_key_slots``: one key of one queue: its running count, its head, its limits.

    ``running`` counts the key's ``processing`` rows plus the slots its
    timed-out handlers keep (``soniq_key_holds``); ``head`` is the job the
    key offers to the claims (None: none). ``configured_*`` are the limits
    the last enqueue of the key declared (``@job(key_concurrency=...,
    key_rate=...)``). Written only by the enqueue and the triggers.
    """

    queue = models.TextField()
    key = models.TextField()
    running = models.IntegerField(default=0, db_default=0)
    head = models.UUIDField(null=True, blank=True)
    head_run_at = models.DateTimeField(null=True, blank=True)
    configured_concurrency = models.IntegerField(null=True, blank=True)
    configured_rate_limit = models.IntegerField(null=True, blank=True)
    configured_rate_period = models.IntegerField(null=True, blank=True)
    # SQLite only: a write of it runs the admission (a trigger; SQLite has no functions).
    pokes = models.BigIntegerField(default=0, db_default=0)
    updated_at = models.DateTimeField(default=timezone.now, db_default=Now())

    class Meta:
        db_table = "soniq_key_slots"
        verbose_name = "key"
        constraints = [
            models.UniqueConstraint(fields=["queue", "key"], name="soniq_key_slots_key"),
            models.CheckConstraint(
                condition=Q(configured_concurrency__isnull=True)
                | Q(configured_concurrency__gte=1), name="soniq_key_slots_concurrency_valid"),
            models.CheckConstraint(
                condition=(Q(configured_rate_limit__isnull=True)
                           & Q(configured_rate_period__isnull=True))
                | (Q(configured_rate_limit__gte=1) & Q(configured_rate_period__gte=1)
                   & Q(configured_rate_period__lte=86400)),
                name="soniq_key_slots_rate_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.key}"


class KeyLimit(models.Model):
    """``soniq_key_limits``: an operator's limits for a key, or for keys matching a pattern.

    ``key_pattern`` is a key, or a pattern where ``*`` stands for any text
    (``tenant-*``, ``*``). Of the rows matching a key, the exact one wins,
    then the longest pattern; its non-empty fields override what the jobs
    declared, field by field (the rate's two columns as one field).
    """

    queue = models.TextField()
    key_pattern = models.TextField()
    concurrency = models.IntegerField(
        null=True, blank=True,
        help_text="At most this many jobs of a matching key run at once. Empty: the jobs' "
                  "@job(key_concurrency=...) decides.")
    rate_limit = models.IntegerField(
        null=True, blank=True,
        help_text="At most this many starts of a matching key in any window of rate period "
                  "seconds. Empty: the jobs' @job(key_rate=...) decides.")
    rate_period = models.IntegerField(
        null=True, blank=True, help_text="Seconds (1 for a rate per second, 60 per minute).")
    updated_at = models.DateTimeField(default=timezone.now, db_default=Now())

    class Meta:
        db_table = "soniq_key_limits"
        verbose_name = "key limit"
        constraints = [
            models.UniqueConstraint(fields=["queue", "key_pattern"],
                                    name="soniq_key_limits_pattern"),
            models.CheckConstraint(condition=Q(concurrency__isnull=True) | Q(concurrency__gte=1),
                                   name="soniq_key_limits_concurrency_valid"),
            models.CheckConstraint(condition=_RATE_VALID, name="soniq_key_limits_rate_valid"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.key_pattern}"


class KeyParked(models.Model):
    """``soniq_key_parked``: a keyed job held back; ``run_at`` is the due time it asked for."""

    job_id = models.UUIDField(primary_key=True)
    queue = models.TextField()
    key = models.TextField()
    priority = models.IntegerField()
    created_at = models.DateTimeField()
    run_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "soniq_key_parked"
        verbose_name = "parked keyed job"
        indexes = [
            # The order a key offers its jobs in: by priority, then by how long each has
            # been due (an unscheduled job since it was enqueued). A level's first entry
            # is due when any of its jobs is (sql/key_order_v1.sql, decision 0052).
            models.Index(F("queue"), F("key"), F("priority"), Coalesce("run_at", "created_at"),
                         name="soniq_key_parked_rank_idx"),
            # With none due: the job due first.
            models.Index(fields=["queue", "key", "run_at"], name="soniq_key_parked_due_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.job_id} ({self.key})"


class KeyStart(models.Model):
    """``soniq_key_starts``: the recent starts of a key with a rate (its sliding window)."""

    queue = models.TextField()
    key = models.TextField()
    started_at = models.DateTimeField()

    class Meta:
        db_table = "soniq_key_starts"
        verbose_name = "key start"
        indexes = [models.Index(fields=["queue", "key", "started_at"],
                                name="soniq_key_starts_idx")]

    def __str__(self) -> str:
        return f"{self.key} {self.started_at:%H:%M:%S}"


class KeyHold(models.Model):
    """``soniq_key_holds``: a key's slot kept by the hold (``soniq_queue_holds``) of a
    timed-out handler that runs on; given back when that hold row is deleted."""

    job_id = models.UUIDField()
    generation = models.BigIntegerField()
    queue = models.TextField()
    key = models.TextField()

    class Meta:
        db_table = "soniq_key_holds"
        verbose_name = "key hold"
        constraints = [models.UniqueConstraint(fields=["job_id", "generation"],
                                               name="soniq_key_holds_claim")]

    def __str__(self) -> str:
        return f"{self.key} {self.job_id}"
