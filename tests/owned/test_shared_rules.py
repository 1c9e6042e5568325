"""The rules both implementations share -- backoff and attempt limits -- on one table of cases.

The claim protocol has two implementations: the PL/pgSQL functions on
PostgreSQL (``soniq_fail``, the reaper inside ``soniq_claim_many``) and the
Python twin on SQLite (``owned._store.SqliteClaims``). Each rule below is a
table of cases; the suite runs the same table once per backend, so each
implementation answers the same cases through the same public API.
"""

import datetime as dt

import pytest
from django.db import connection
from django.test import override_settings

from soniq_django import enqueue
from soniq_django.models import DeadLetterJob, Job, TaskRegistration
from soniq_django.owned import OwnedJobSource
from tests.support.owned import nonce, rewrite

pytestmark = pytest.mark.django_db


def database_now() -> dt.datetime:
    with connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
    return dt.datetime.now(dt.UTC)


def claim_at_attempt(source: OwnedJobSource, job_id, attempt: int):
    """Claim ``job_id`` so that the claim is its ``attempt``-th."""
    rewrite(job_id, attempts=attempt - 1)
    claimed = source.claim_next_owned("rules-worker", claim_token=nonce())
    assert claimed is not None and claimed.attempts == attempt
    return claimed


# Backoff: a retry waits min(cap, base * 2^(attempt - 1)), times a jitter
# factor in [0.5, 1]. (attempt that failed, base, cap) -> nominal seconds.
BACKOFF = [
    (1, 2, 3600, 2),
    (2, 2, 3600, 4),
    (3, 10, 3600, 40),
    (5, 10, 60, 60),  # capped
    (40, 1, 3600, 3600),  # a huge exponent is capped, not an overflow
    (1, 0, 0, 0),  # no backoff at all
]


@pytest.mark.parametrize(("attempt", "base", "cap", "nominal"), BACKOFF)
def test_a_retry_waits_the_shared_backoff(attempt, base, cap, nominal):
    source = OwnedJobSource()
    job_id = enqueue("rules.flaky", max_attempts=100)
    claimed = claim_at_attempt(source, job_id, attempt)
    with override_settings(SONIQ={"RETRY_BASE_SECONDS": base, "RETRY_MAX_SECONDS": cap}):
        before = database_now()
        assert source.fail_owned(claimed.claim_fence, "boom", retry=True) is True
        after = database_now()
    row = Job.objects.get(id=job_id)
    assert row.status == "queued"
    slack = dt.timedelta(milliseconds=5)
    assert before + dt.timedelta(seconds=nominal * 0.5) - slack <= row.scheduled_at
    assert row.scheduled_at <= after + dt.timedelta(seconds=nominal) + slack


# Attempt limits: a failed attempt with retry is queued again while
# attempts < limit, else dead-lettered as max_retries_exceeded. The limit is
# the row's max_attempts; NULL means the caller's default (the worker passes
# the handler's retries + 1), else DEFAULT_MAX_ATTEMPTS.
# (max_attempts, caller default, setting, attempt that failed) -> queued again?
LIMITS = [
    (3, None, None, 2, True),
    (3, None, None, 3, False),
    (1, None, None, 1, False),
    (None, 2, None, 1, True),
    (None, 2, None, 2, False),
    (None, None, None, 3, True),  # DEFAULT_MAX_ATTEMPTS, 4 unless set
    (None, None, None, 4, False),
    (None, None, 2, 2, False),  # the setting
    (3, 1, None, 2, True),  # the row's own limit wins over the default
]


@pytest.mark.parametrize(("max_attempts", "default", "setting", "attempt", "requeued"), LIMITS)
def test_a_failed_retry_counts_against_the_shared_limit(max_attempts, default, setting,
                                                        attempt, requeued):
    source = OwnedJobSource()
    job_id = enqueue("rules.flaky", max_attempts=max_attempts)
    claimed = claim_at_attempt(source, job_id, attempt)
    soniq = {"RETRY_BASE_SECONDS": 0}
    if setting is not None:
        soniq["DEFAULT_MAX_ATTEMPTS"] = setting
    with override_settings(SONIQ=soniq):
        assert source.fail_owned(claimed.claim_fence, "boom", retry=True,
                                 default_max_attempts=default) is True
    if requeued:
        assert Job.objects.get(id=job_id).status == "queued"
    else:
        dead = DeadLetterJob.objects.get(id=job_id)
        assert (dead.dead_letter_reason, dead.attempts) == ("max_retries_exceeded", attempt)


# A lapsed claim is an attempt too: the reaper (inside every claim) queues it
# again while attempts < limit, else dead-letters it. For max_attempts NULL
# the limit is the job name's registry row, else DEFAULT_MAX_ATTEMPTS.
# (max_attempts, registry max_attempts, attempt that lapsed) -> queued again?
LAPSES = [
    (3, None, 2, True),
    (3, None, 3, False),
    (None, None, 3, True),
    (None, None, 4, False),
    (None, 2, 1, True),
    (None, 2, 2, False),
]


@pytest.mark.parametrize(("max_attempts", "registry", "attempt", "requeued"), LAPSES)
def test_a_lapsed_claim_counts_against_the_shared_limit(max_attempts, registry, attempt,
                                                        requeued):
    source = OwnedJobSource()
    job_id = enqueue("rules.crashes", max_attempts=max_attempts)
    if registry is not None:
        TaskRegistration.objects.create(task_name="rules.crashes", worker_id="rules-worker",
                                        queue="default", max_attempts=registry)
    claim_at_attempt(source, job_id, attempt)
    rewrite(job_id, lease_expires_at=database_now() - dt.timedelta(seconds=1))
    source.claim_next_owned("reaping-worker", claim_token=nonce(), queues=["elsewhere"])
    if requeued:
        row = Job.objects.get(id=job_id)
        assert (row.status, row.attempts) == ("queued", attempt)
    else:
        dead = DeadLetterJob.objects.get(id=job_id)
        assert (dead.dead_letter_reason, dead.attempts) == ("max_retries_exceeded", attempt)
