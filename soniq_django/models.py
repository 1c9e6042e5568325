"""Soniq storage format 1 as Django models.

Each model maps one format-1 table column for column: ``db_table`` is the
table, field names are the column names, and database defaults
(``db_default``) are what a raw ``INSERT`` from another language relies on.
Rows are written only through the services (``enqueue``, the owned queue,
the worker); these models are for reading, the admin and migrations.
"""

import datetime as dt
import uuid

from django.db import models
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from .conf import DEFAULT_MAX_ATTEMPTS
from .fields import QueueListField


class JobStatus(models.TextChoices):
    """States of a row in ``soniq_jobs``. Dead-lettered jobs live in another table.

    The job state machine, every writer included. "Fenced" writes present the
    claim's whole fence and apply only to a live claim (docs/claim-protocol.md);
    the PL/pgSQL functions (sql/claim_protocol_v*.sql) and their SQLite twin
    (owned._store.SqliteClaims) implement the same table.

    ========================  ==========  ===========  ==========================================
    writer                    from        to           columns set
    ========================  ==========  ===========  ==========================================
    enqueue, submit_owned     (new row)   queued       every authored column; attempts 0
    claim (soniq_claim[_many])  queued    processing   attempts+1, claim_generation+1,
                                                       claim_owner, claim_token, worker_id,
                                                       lease_expires_at, pid, cancel_requested=f
    heartbeat (fenced)        processing  processing   lease_expires_at
    complete (fenced)         processing  done         result, expires_at (+RESULT_TTL);
                                                       lease, pid cleared
    defer (fenced): given     processing  queued       attempts-1 (not an attempt), last_error,
    back, e.g. no handler                              scheduled_at (+delay); lease, pid cleared
    fail, retry, attempts     processing  queued       last_error, scheduled_at (+backoff);
    left (fenced)                                      lease, pid cleared
    ... a queued twin holds   processing  cancelled    last_error "superseded: ...",
    its unique/dedup key                               expires_at; lease, pid cleared
    fail, none left or no     processing  (dead        row moved to soniq_dead_letter_jobs
    retry (fenced)                        letter)      (max_retries_exceeded or the reason)
    enqueue with depends_on   (new row)   queued       scheduled_at 9999-01-01 while a dependency
    (soniq_enqueue_after)                              can still end; soniq_job_waits, edges
    its last dependency done  queued      queued       scheduled_at back to its run_at (trigger,
                                                       in the completion's transaction)
    a dependency cancelled    queued      cancelled    last_error "dependency_failed:<id>",
    or dead-lettered                                   expires_at (trigger, same transaction)
    request_cancel            queued      cancelled    expires_at (+RESULT_TTL)
    request_cancel, lease     processing  cancelled    cancel_requested, expires_at;
    lapsed                                             lease, pid cleared
    request_cancel, live      processing  processing   cancel_requested=t
    acknowledge_cancel        processing  cancelled    expires_at; lease, pid cleared
    (fenced, requested)
    reaper (in every claim),  processing  cancelled    expires_at; lease, pid cleared
    lease lapsed, requested
    reaper, attempts reached  processing  (dead        max_retries_exceeded; NULL
    the limit                             letter)      max_attempts counts against the registry
    reaper, otherwise         processing  queued       last_error "lease lapsed ...";
                                                       (or cancelled "superseded", as above)
    submit_owned(force=True)  queued or   cancelled    expires_at (+RESULT_TTL); lease, pid
    of an active key          processing               cleared
    dead-letter replay        (dead       queued       the dead letter's job under its own id;
                              letter)                  resurrection_count+1 on the letter
    housekeeping purge        done or     (deleted)    when expires_at passed; never a
                              cancelled                protected owned submission
    ========================  ==========  ===========  ==========================================
    """

    QUEUED = "queued"
    """Waiting to run: put here by enqueue, by a retry, or by a replay."""
    PROCESSING = "processing"
    """Claimed by a worker, which moves it on to done, queued or the dead letters."""
    DONE = "done"
    """Finished; the worker stored ``result`` and ``expires_at``."""
    CANCELLED = "cancelled"
    """Cancelled by an operator before or while it ran."""


class DeadLetterReason(models.TextChoices):
    """Why a job left ``soniq_jobs`` for good."""

    MAX_RETRIES_EXCEEDED = "max_retries_exceeded"
    """Every allowed attempt failed."""
    PERMANENT_FAILURE = "permanent_failure"
    """The handler said retrying cannot help."""
    JOB_NOT_FOUND = "job_not_found"
    """No handler is registered under the job's name."""
    INVALID_ARGUMENTS = "invalid_arguments"
    """The stored args do not fit the handler's signature."""


class ScheduleType(models.TextChoices):
    """How ``soniq_recurring_jobs.schedule_value`` is read."""

    INTERVAL = "interval"
    """Seconds between runs, as a string."""
    CRON = "cron"
    """A five-field cron expression."""


class ScheduleStatus(models.TextChoices):
    """Whether the scheduler enqueues a recurring job."""

    ACTIVE = "active"
    """Enqueued each time it is due."""
    PAUSED = "paused"
    """Kept, but not enqueued."""


class WorkerState(models.TextChoices):
    """Life of a row in ``soniq_workers``, with Soniq's own values; only the worker moves it."""

    ACTIVE = "active"
    """Claiming and running jobs, heartbeating."""
    STOPPING = "stopping"
    """Told to stop: finishing in-flight jobs, claiming no more."""
    STOPPED = "stopped"
    """Exited cleanly (or, for Soniq's own sweep, silent for too long)."""


class Job(models.Model):
    """``soniq_jobs``: one row per job."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job_name = models.TextField()
    args = models.JSONField(default=dict, db_default={})
    args_hash = models.TextField(null=True, blank=True)
    status = models.TextField(
        choices=JobStatus.choices, default=JobStatus.QUEUED, db_default=JobStatus.QUEUED
    )
    attempts = models.IntegerField(default=0, db_default=0)
    max_attempts = models.IntegerField(
        null=True, blank=True, default=DEFAULT_MAX_ATTEMPTS, db_default=DEFAULT_MAX_ATTEMPTS)
    queue = models.TextField(default="default", db_default="default")
    priority = models.IntegerField(default=100, db_default=100)
    unique_job = models.BooleanField(default=False, db_default=False)
    dedup_key = models.TextField(null=True, blank=True)
    scheduled_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(null=True, blank=True)
    result = models.JSONField(null=True, blank=True)
    producer_id = models.TextField(null=True, blank=True)
    worker_id = models.UUIDField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_default=Now())
    updated_at = models.DateTimeField(default=timezone.now, db_default=Now())

    # Owned-queue metadata (migration 0003, additive). Written only by the
    # fenced operations of soniq_django.owned; see docs/claim-protocol.md.
    claim_generation = models.BigIntegerField(default=0, db_default=0, editable=False)
    claim_token = models.CharField(max_length=255, null=True, blank=True, editable=False)
    claim_owner = models.CharField(max_length=255, null=True, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    fence_required = models.BooleanField(default=False, db_default=False, editable=False)
    cancel_requested = models.BooleanField(default=False, db_default=False, editable=False)
    pid = models.IntegerField(null=True, blank=True, editable=False)
    active_key = models.CharField(max_length=255, null=True, blank=True, editable=False)
    submission_id = models.CharField(max_length=255, null=True, blank=True, editable=False)
    submission_fingerprint = models.CharField(
        max_length=255, null=True, blank=True, editable=False
    )
    # When the current (or, for a finished job, the last) attempt was claimed
    # (migration 0020, additive): set by a trigger on every claim, whoever
    # makes it; heartbeats move updated_at, never this. See JobAttempt.
    claimed_at = models.DateTimeField(null=True, blank=True, editable=False)
    # Whether another job waits for this one (migration 0025, additive; NULL
    # on every other row): set by the enqueue of a dependent while this job
    # can still end, and what lets the workflow triggers skip a plain job in
    # their WHEN clauses (sql/workflows_v1.sql). See JobDependency.
    has_dependents = models.BooleanField(null=True, blank=True, editable=False)
    # The key of a job limited per key (migration 0029, additive; NULL on every
    # other row): computed at enqueue from @job(concurrency_key=...), and what
    # lets the key triggers skip a plain job in their WHEN clauses
    # (sql/claim_protocol_v12.sql). See keys/models.py.
    concurrency_key = models.TextField(null=True, blank=True, editable=False)

    class Meta:
        db_table = "soniq_jobs"
        verbose_name = "job"
        constraints = [
            # What stops a second queued copy of a unique job (format 1).
            models.UniqueConstraint(
                fields=["job_name", "args_hash"],
                condition=Q(status="queued"),
                name="soniq_jobs_unique_queued",
            ),
            # Dedup keys are one namespace across job names and queues.
            models.UniqueConstraint(
                fields=["dedup_key"],
                condition=Q(status="queued") & Q(dedup_key__isnull=False),
                name="soniq_jobs_dedup_queued",
            ),
            models.CheckConstraint(
                condition=Q(status__in=JobStatus.values), name="soniq_jobs_status_valid"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gte=1),
                name="soniq_jobs_max_attempts_positive",
            ),
            models.CheckConstraint(
                condition=Q(attempts__gte=0), name="soniq_jobs_attempts_not_negative"
            ),
            # Owned metadata: a claim token and a submission id each name at
            # most one row, compared exactly (full, plain, binary indexes).
            models.UniqueConstraint(fields=["claim_token"], name="soniq_jobs_claim_token_key"),
            models.UniqueConstraint(
                fields=["submission_id"], name="soniq_jobs_submission_id_key"
            ),
            # At most one live (queued or processing) job per active key.
            models.UniqueConstraint(
                fields=["active_key"],
                condition=Q(status__in=["queued", "processing"]) & Q(active_key__isnull=False),
                name="soniq_jobs_active_key_live",
            ),
            models.CheckConstraint(
                condition=Q(claim_generation__gte=0), name="soniq_jobs_generation_not_negative"
            ),
        ]
        indexes = [
            # "Next eligible job in these queues": queued rows in priority,
            # then arrival, order. Partial, so finished rows cost nothing.
            models.Index(
                fields=["queue", "priority", "created_at"],
                condition=Q(status="queued"),
                name="soniq_jobs_claim_idx",
            ),
            # The same order across every queue, for workers that serve all,
            # in two parts (claim protocol v6, decision 0018): the jobs not
            # scheduled, so that a claim never reads past jobs scheduled for
            # later...
            models.Index(
                fields=["priority", "created_at"],
                condition=Q(status="queued", scheduled_at__isnull=True),
                name="soniq_jobs_claim_now_idx",
            ),
            # ... and the scheduled ones, read only when one is due,
            models.Index(
                fields=["priority", "created_at"],
                condition=Q(status="queued", scheduled_at__isnull=False),
                name="soniq_jobs_claim_scheduled_idx",
            ),
            # which this one tells: the first scheduled job to fall due.
            models.Index(
                fields=["scheduled_at"],
                condition=Q(status="queued", scheduled_at__isnull=False),
                name="soniq_jobs_claim_due_idx",
            ),
            # One queue's unscheduled jobs in claim order (claim protocol v8,
            # decision 0029): a claim that serves some queues, or holds some
            # back, scans each queue it serves on its own, so a backlog it
            # does not serve (a paused queue's, say) is never read.
            models.Index(
                fields=["queue", "priority", "created_at"],
                condition=Q(status="queued", scheduled_at__isnull=True),
                name="soniq_jobs_claim_queue_now_idx",
            ),
            # Housekeeping finds expired finished rows without a scan.
            models.Index(
                fields=["expires_at"],
                condition=Q(expires_at__isnull=False),
                name="soniq_jobs_expires_idx",
            ),
            # Lapsed leases are found without a scan (claims reclaim them).
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="processing"),
                name="soniq_jobs_lease_idx",
            ),
            # The admin's newest-first list, its date drill-down and its
            # search window read this, not the table (migration 0022,
            # decision 0040): one entry per row version, whatever its state.
            models.Index(fields=["created_at"], name="soniq_jobs_created_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.job_name} ({self.status})"


class DeadLetterJob(models.Model):
    """``soniq_dead_letter_jobs``: jobs that failed for good, with their original id."""

    id = models.UUIDField(primary_key=True, editable=False)
    job_name = models.TextField()
    args = models.JSONField(default=dict, db_default={})
    queue = models.TextField(default="default", db_default="default")
    priority = models.IntegerField(default=100, db_default=100)
    max_attempts = models.IntegerField(null=True, blank=True)
    attempts = models.IntegerField(default=0, db_default=0)
    last_error = models.TextField(null=True, blank=True)
    dead_letter_reason = models.TextField(choices=DeadLetterReason.choices)
    original_created_at = models.DateTimeField(null=True, blank=True)
    moved_to_dead_letter_at = models.DateTimeField(default=timezone.now, db_default=Now())
    resurrection_count = models.IntegerField(default=0, db_default=0)
    last_resurrection_at = models.DateTimeField(null=True, blank=True)
    tags = models.JSONField(null=True, blank=True)

    # Owned submission identity, kept through the move (migration 0003).
    fence_required = models.BooleanField(default=False, db_default=False, editable=False)
    submission_id = models.CharField(max_length=255, null=True, blank=True, editable=False)
    submission_fingerprint = models.CharField(
        max_length=255, null=True, blank=True, editable=False
    )

    class Meta:
        db_table = "soniq_dead_letter_jobs"
        verbose_name = "dead-letter job"
        indexes = [
            models.Index(fields=["moved_to_dead_letter_at"], name="soniq_dlq_moved_idx"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["submission_id"], name="soniq_dlq_submission_id_key"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_name} ({self.dead_letter_reason})"


class RecurringJob(models.Model):
    """``soniq_recurring_jobs``: one schedule per job name, read by the scheduler."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    job_name = models.TextField(unique=True)
    schedule_type = models.TextField(choices=ScheduleType.choices)
    schedule_value = models.TextField()
    job_kwargs = models.JSONField(default=dict, db_default={})
    status = models.TextField(
        choices=ScheduleStatus.choices,
        default=ScheduleStatus.ACTIVE,
        db_default=ScheduleStatus.ACTIVE,
    )
    queue = models.TextField(default="default", db_default="default")
    priority = models.IntegerField(default=100, db_default=100)
    max_attempts = models.IntegerField(
        null=True, blank=True, default=DEFAULT_MAX_ATTEMPTS, db_default=DEFAULT_MAX_ATTEMPTS)
    next_run = models.DateTimeField(null=True, blank=True)
    last_run = models.DateTimeField(null=True, blank=True)
    run_count = models.IntegerField(default=0, db_default=0)
    last_job_id = models.UUIDField(null=True, blank=True)

    class Meta:
        db_table = "soniq_recurring_jobs"
        verbose_name = "recurring job"
        constraints = [
            models.CheckConstraint(
                condition=Q(schedule_type__in=ScheduleType.values),
                name="soniq_recurring_type_valid",
            ),
            models.CheckConstraint(
                condition=Q(status__in=ScheduleStatus.values),
                name="soniq_recurring_status_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.job_name} ({self.schedule_type} {self.schedule_value})"


class Worker(models.Model):
    """``soniq_workers``: one row per worker process, kept fresh by its heartbeat.

    This is Soniq's own table, column for column, so that soniq_django's
    workers and Soniq's workers register side by side (``soniq_jobs.worker_id``
    names a row here; Soniq declares that as a foreign key). A process has at
    most one row: ``(hostname, pid)`` is unique.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    hostname = models.TextField()
    pid = models.IntegerField()
    queues = QueueListField(
        null=True, blank=True, default=list,
        help_text="Queue names; empty (or null) for every queue.",
    )
    concurrency = models.IntegerField(default=1, db_default=1)
    status = models.TextField(
        choices=WorkerState.choices, default=WorkerState.ACTIVE, db_default=WorkerState.ACTIVE
    )
    last_heartbeat = models.DateTimeField(default=timezone.now, db_default=Now())
    started_at = models.DateTimeField(default=timezone.now, db_default=Now())
    version = models.TextField(
        null=True, blank=True, help_text="Who runs it; soniq_django writes its name and version."
    )
    metadata = models.JSONField(null=True, blank=True, default=dict, db_default={})

    class Meta:
        db_table = "soniq_workers"
        verbose_name = "worker"
        # Names are Soniq's. On PostgreSQL the pair is a unique *index*, as
        # Soniq creates it (a later migration must drop it with DROP INDEX).
        # The indexes on last_heartbeat and status exist in the database
        # too, under Soniq's names, which are longer than Django allows an
        # Index to be named: migration 0006 creates them.
        constraints = [
            models.UniqueConstraint(fields=["hostname", "pid"], name="idx_soniq_workers_host_pid"),
            models.CheckConstraint(
                condition=Q(status__in=WorkerState.values), name="soniq_workers_status_check"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.hostname}:{self.pid} ({self.status})"


class TaskRegistration(models.Model):
    """``soniq_task_registry``: which worker handles which job name, for people to read.

    Soniq's own table: one row per (job name, worker), refreshed when that
    worker starts. Nothing reads it to route a job; the reaper reads
    ``max_attempts`` to count lapsed claims of a job whose own
    ``max_attempts`` is NULL (sql/claim_protocol_v3.sql), and a worker with
    no handler for a job's name defers the job while a live worker serving
    its queue registered the name (worker/unknown.py). soniq_django's
    workers also fill ``queue``, ``max_attempts`` and ``unique_job``, which
    stay NULL in rows that Soniq's workers write.
    """

    pk = models.CompositePrimaryKey("task_name", "worker_id")
    task_name = models.TextField()
    worker_id = models.TextField()
    last_seen_at = models.DateTimeField(default=timezone.now)
    args_model_repr = models.TextField(null=True, blank=True)
    queue = models.TextField(null=True, blank=True)
    max_attempts = models.IntegerField(null=True, blank=True)
    unique_job = models.BooleanField(null=True, blank=True)

    class Meta:
        db_table = "soniq_task_registry"
        verbose_name = "registered task"
        # The index on task_name (idx_soniq_task_registry_task_name) is
        # created by migration 0006 under Soniq's name.

    def __str__(self) -> str:
        return f"{self.task_name} @ {self.worker_id}"


class ThroughputMinute(models.Model):
    """``soniq_throughput``: jobs finished per queue and minute, for the dashboard.

    Not part of format 1. Workers add their counts once per heartbeat, so
    the history outlives the finished rows that housekeeping deletes.
    """

    minute = models.DateTimeField()
    queue = models.TextField()
    done = models.IntegerField(default=0, db_default=0)
    failed = models.IntegerField(default=0, db_default=0)
    dead_lettered = models.IntegerField(default=0, db_default=0)
    cancelled = models.IntegerField(default=0, db_default=0)

    class Meta:
        db_table = "soniq_throughput"
        verbose_name = "throughput minute"
        constraints = [
            models.UniqueConstraint(fields=["minute", "queue"], name="soniq_throughput_minute_queue"),
        ]

    def __str__(self) -> str:
        return f"{self.queue} {self.minute:%H:%M}"


class QueueSetting(models.Model):
    """``soniq_queue_settings``: flow control of one queue, read by every claim (protocol v5).

    Not part of format 1. The claim functions (sql/claim_protocol_v5.sql)
    and their SQLite twin read this table, never Django's settings, so
    every worker of any language obeys the same row. Two sets of limits:

    - ``configured_*``: ``SONIQ["QUEUES"]`` as the last soniq_django worker
      to start (or ``soniq_queue sync``) wrote it; never edited by hand;
    - ``concurrency``, ``rate_limit``/``rate_period``: an operator's
      override (the admin, SQL); NULL falls back to the configured value,
      field by field (the rate's two columns as one field).

    A row with nothing set and ``paused`` false changes nothing. See
    docs/operations.md and docs/decisions/0016-queue-flow-control.md.
    """

    queue = models.TextField(primary_key=True)
    paused = models.BooleanField(
        default=False, db_default=False,
        help_text="Claims skip this queue's jobs on every worker; running jobs finish.")
    paused_at = models.DateTimeField(null=True, blank=True)
    paused_by = models.TextField(null=True, blank=True)
    concurrency = models.IntegerField(
        null=True, blank=True,
        help_text="At most this many of the queue's jobs run at once, across all workers. "
                  "Empty: SONIQ['QUEUES'] decides.")
    rate_limit = models.IntegerField(
        null=True, blank=True,
        help_text="At most this many of the queue's jobs start in any window of rate period "
                  "seconds, across all workers. Empty: SONIQ['QUEUES'] decides.")
    rate_period = models.IntegerField(
        null=True, blank=True, help_text="Seconds (1 for a rate per second, 60 per minute).")
    configured_concurrency = models.IntegerField(null=True, blank=True, editable=False)
    configured_rate_limit = models.IntegerField(null=True, blank=True, editable=False)
    configured_rate_period = models.IntegerField(null=True, blank=True, editable=False)
    updated_at = models.DateTimeField(default=timezone.now, db_default=Now())

    class Meta:
        db_table = "soniq_queue_settings"
        verbose_name = "queue setting"
        constraints = [
            models.CheckConstraint(
                condition=Q(concurrency__isnull=True) | Q(concurrency__gte=1),
                name="soniq_queue_concurrency_positive"),
            models.CheckConstraint(
                condition=Q(configured_concurrency__isnull=True)
                | Q(configured_concurrency__gte=1),
                name="soniq_queue_configured_concurrency_positive"),
            models.CheckConstraint(
                condition=(Q(rate_limit__isnull=True) & Q(rate_period__isnull=True))
                | (Q(rate_limit__gte=1) & Q(rate_period__gte=1) & Q(rate_period__lte=86400)),
                name="soniq_queue_rate_valid"),
            models.CheckConstraint(
                condition=(Q(configured_rate_limit__isnull=True)
                           & Q(configured_rate_period__isnull=True))
                | (Q(configured_rate_limit__gte=1) & Q(configured_rate_period__gte=1)
                   & Q(configured_rate_period__lte=86400)),
                name="soniq_queue_configured_rate_valid"),
        ]

    @property
    def effective_concurrency(self) -> int | None:
        """The limit the claim applies: the override, else the configured one (None: none)."""
        limit: int | None = (self.concurrency if self.concurrency is not None
                             else self.configured_concurrency)
        return limit

    @property
    def effective_rate(self) -> tuple[int, int] | None:
        """``(starts, per seconds)`` the claim applies, or None."""
        if self.rate_limit is not None:
            return self.rate_limit, self.rate_period
        if self.configured_rate_limit is not None:
            return self.configured_rate_limit, self.configured_rate_period
        return None

    def __str__(self) -> str:
        return str(self.queue)


#: The rows of soniq_queue_settings a claim has to look at (the rest change nothing).
FLOW_CONTROLLED = (
    Q(paused=True) | Q(concurrency__isnull=False) | Q(configured_concurrency__isnull=False)
    | Q(rate_limit__isnull=False) | Q(configured_rate_limit__isnull=False)
)


class QueueStart(models.Model):
    """``soniq_queue_starts``: when each recent claim of a rate-limited queue started.

    The rate limit's sliding window: a claim of such a queue counts the
    rows younger than the period (under the queue's lock) and adds one per
    job it starts; older rows are deleted by the same claim, so a queue
    keeps at most its limit of rows. Written only by the claim.
    """

    queue = models.TextField()
    started_at = models.DateTimeField()

    class Meta:
        db_table = "soniq_queue_starts"
        verbose_name = "queue start"
        indexes = [models.Index(fields=["queue", "started_at"], name="soniq_queue_starts_idx")]

    def __str__(self) -> str:
        return f"{self.queue} {self.started_at:%H:%M:%S}"


class QueueHold(models.Model):
    """``soniq_queue_holds``: a limited queue's slot kept by a handler that outlived its claim.

    A job past its time limit is failed at its deadline (its row goes back
    to ``queued`` or to the dead letters), but a plain function cannot be
    stopped and runs on. Its queue's concurrency slot stays taken until it
    returns: the timeout's failure and this row are written in one
    transaction, so the slot passes from the ``processing`` row to the hold
    without a gap, and the worker deletes the hold when the handler returns
    (exactly once). A hold has a lease, renewed by its worker's heartbeat: a
    worker that dies releases its holds when their leases lapse. A claim
    counts a queue's running jobs as its ``processing`` rows plus its live
    holds. Not a format-1 table: soniq_django's own, like
    ``soniq_queue_settings``.
    """

    job_id = models.UUIDField()
    generation = models.BigIntegerField()
    queue = models.TextField()
    claim_owner = models.TextField()
    lease_expires_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now, db_default=Now())

    class Meta:
        db_table = "soniq_queue_holds"
        verbose_name = "queue hold"
        constraints = [models.UniqueConstraint(fields=["job_id", "generation"],
                                               name="soniq_queue_holds_claim_uniq")]
        indexes = [models.Index(fields=["queue", "lease_expires_at"],
                                name="soniq_queue_holds_queue_idx")]

    def __str__(self) -> str:
        return f"{self.queue} {self.job_id}"


class AttemptOutcome(models.TextChoices):
    FAILED = "failed", "failed (retried)"
    LAPSED = "lapsed", "lease lapsed"
    DEFERRED = "deferred", "deferred (handler unknown here)"
    DEAD = "dead", "dead-lettered"


class JobAttempt(models.Model):
    """``soniq_job_attempts``: each attempt of a job that ended without finishing it.

    A row is written by a trigger in the same transaction as the write that
    ended the attempt (a failure put back in the queue, a lapsed lease, a
    deferral, the move to the dead letters), whoever made it: this worker,
    a worker in another language, Soniq, an operator. A job's current
    attempt, and the one that finished it (``done`` or ``cancelled``), are
    its ``soniq_jobs`` row itself (``claimed_at``, ``worker_id``,
    ``updated_at``), so a job that succeeds at its first attempt writes
    nothing here. Rows go with the job (soniq_django.attempts); at most
    ``KEPT_PER_JOB`` are kept per job. Not part of format 1.
    """

    #: The newest rows kept per job (sql/attempts_v1.sql keeps the same number).
    KEPT_PER_JOB = 100

    job_id = models.UUIDField()
    attempt = models.IntegerField()
    generation = models.BigIntegerField()
    worker_id = models.UUIDField(null=True, blank=True)
    claim_owner = models.CharField(max_length=255, null=True, blank=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField()
    outcome = models.TextField(choices=AttemptOutcome.choices)
    dead_letter_reason = models.TextField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)

    class Meta:
        db_table = "soniq_job_attempts"
        verbose_name = "job attempt"
        indexes = [models.Index(fields=["job_id", "id"], name="soniq_job_attempts_job_idx")]

    def __str__(self) -> str:
        return f"{self.job_id} attempt {self.attempt} ({self.outcome})"


class JobTrace(models.Model):
    """``soniq_job_trace``: the trace context a job was enqueued under (docs/tracing.md).

    One row for a job enqueued while an OpenTelemetry span was recording:
    its W3C ``traceparent`` and ``tracestate``, written in the enqueue's own
    statement or transaction. A job enqueued without one has no row, and
    nothing here is read or written unless tracing is on. The row stays
    while the job is in either job table (a dead letter keeps it, so that a
    replay links to the same enqueue) and goes with it: the triggers of
    sql/job_trace_v1.sql delete it when the job leaves both. Not part of
    format 1; a producer in another language may write a row (or not).
    """

    job_id = models.UUIDField(primary_key=True)
    #: W3C Trace Context's ``traceparent`` (55 characters in version 00).
    traceparent = models.CharField(max_length=128)
    #: Its ``tracestate``, when the producer's context had one (W3C: up to 512 characters).
    tracestate = models.CharField(max_length=512, null=True, blank=True)

    class Meta:
        db_table = "soniq_job_trace"
        verbose_name = "job trace context"

    def __str__(self) -> str:
        return f"{self.job_id} {self.traceparent}"


class JobProgress(models.Model):
    """``soniq_job_progress``: the last progress a job's handler reported (docs/workflows.md).

    One row for a job whose handler called ``current_job().set_progress()``
    (at most about one write a second, the last value always written),
    written by ``soniq_set_progress`` under the claim's fence (on SQLite by
    its twin in owned/_store.py): a lapsed claim writes nothing. Kept after
    the job finished, while the job is in either job table; the triggers of
    sql/job_progress_v1.sql delete it when the job leaves both. Not part of
    format 1.
    """

    job_id = models.UUIDField(primary_key=True)
    done = models.BigIntegerField()
    total = models.BigIntegerField(null=True, blank=True)
    note = models.TextField(null=True, blank=True)
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "soniq_job_progress"
        verbose_name = "job progress"
        verbose_name_plural = "job progress"

    def __str__(self) -> str:
        of = "" if self.total is None else f"/{self.total}"
        return f"{self.job_id} {self.done}{of}"


#: The ``scheduled_at`` of a job that waits for its dependencies: 9999-01-01 UTC, a time no
#: claim reaches (sql/producer_api_v5.sql; the triggers release it).
WAITING_SCHEDULED_AT = dt.datetime(9999, 1, 1, tzinfo=dt.timezone.utc)


class DependencyState(models.TextChoices):
    WAITING = "waiting", "waiting"
    DONE = "done", "done"
    FAILED = "failed", "failed (cancelled or dead-lettered)"


class JobDependency(models.Model):
    """``soniq_job_dependencies``: job ``job_id`` waits for job ``depends_on``.

    Written by the dependent's enqueue (``depends_on=[...]``, a batch's
    callback, a chain), in its transaction; ``state`` is moved from
    ``waiting`` by the triggers of sql/workflows_v1.sql in the transaction of
    the write that ends ``depends_on``. ``any_outcome``: the dependent waits
    for the job to finish whatever its outcome (a batch's callback); else it
    needs it ``done``. Kept while the dependent's row is (housekeeping takes
    it with the row), so the admin links both ways. Not part of format 1.
    """

    job_id = models.UUIDField()
    depends_on = models.UUIDField()
    any_outcome = models.BooleanField(default=False)
    state = models.TextField(choices=DependencyState.choices)

    class Meta:
        db_table = "soniq_job_dependencies"
        verbose_name = "job dependency"
        verbose_name_plural = "job dependencies"
        constraints = [models.UniqueConstraint(fields=["job_id", "depends_on"],
                                               name="soniq_job_dependencies_pair")]
        indexes = [models.Index(fields=["depends_on"], name="soniq_job_dependencies_on_idx")]

    def __str__(self) -> str:
        return f"{self.job_id} after {self.depends_on} ({self.state})"


class JobWait(models.Model):
    """``soniq_job_waits``: a job that still waits for ``pending`` of its dependencies.

    Its row in ``soniq_jobs`` is queued with ``scheduled_at`` at
    ``WAITING_SCHEDULED_AT``; ``run_at`` is the time it asked for, restored
    when the last dependency is done (the row is then deleted). Not part of
    format 1.
    """

    job_id = models.UUIDField(primary_key=True)
    pending = models.IntegerField()
    run_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "soniq_job_waits"
        verbose_name = "waiting job"

    def __str__(self) -> str:
        return f"{self.job_id} waits for {self.pending}"


class Batch(models.Model):
    """``soniq_batches``: jobs enqueued together by ``soniq_django.batch()``.

    ``callback_id`` is the ``on_complete`` job: it waits (``any_outcome``)
    for every member. Not part of format 1.
    """

    id = models.UUIDField(primary_key=True)
    size = models.IntegerField()
    callback_id = models.UUIDField(null=True, blank=True, unique=True)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "soniq_batches"
        verbose_name = "batch"
        verbose_name_plural = "batches"

    def __str__(self) -> str:
        return f"batch {self.id} ({self.size} jobs)"


class BatchMember(models.Model):
    """``soniq_batch_members``: the ``position``-th job of a batch (from 0, as given)."""

    batch_id = models.UUIDField()
    position = models.IntegerField()
    job_id = models.UUIDField()

    class Meta:
        db_table = "soniq_batch_members"
        verbose_name = "batch member"
        constraints = [models.UniqueConstraint(fields=["batch_id", "position"],
                                               name="soniq_batch_members_pos")]
        indexes = [models.Index(fields=["job_id"], name="soniq_batch_members_job_idx")]

    def __str__(self) -> str:
        return f"{self.batch_id}[{self.position}] = {self.job_id}"


class JobStep(models.Model):
    """``soniq_job_steps``: a durable step of a job, recorded once (docs/steps.md).

    One row per ``current_job().step(name, ...)`` that returned: its JSON
    ``result``, ``size`` (bytes of its JSON text), the ``attempt`` and claim
    ``generation`` that recorded it, at ``recorded_at`` (database time).
    Written by ``soniq_record_step`` under the claim's fence (on SQLite by
    its twin in steps/store.py): a lapsed claim records nothing. Kept while
    the job is in either job table; the triggers of sql/steps_v1.sql delete
    it when the job leaves both. Not part of format 1.
    """

    pk = models.CompositePrimaryKey("job_id", "name")
    job_id = models.UUIDField()
    name = models.TextField()
    result = models.JSONField(null=True, blank=True)
    size = models.IntegerField()
    attempt = models.IntegerField()
    generation = models.BigIntegerField()
    recorded_at = models.DateTimeField()

    class Meta:
        db_table = "soniq_job_steps"
        verbose_name = "job step"
        verbose_name_plural = "job steps"

    def __str__(self) -> str:
        return f"{self.job_id} {self.name}"
# Limits per key (migration 0029): their tables live in keys/models.py.
from .keys.models import KeyHold, KeyLimit, KeyParked, KeySlot, KeyStart  # noqa: E402,F401
