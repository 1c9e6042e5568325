"""A downgrade below migration 0029 refuses while keyed jobs are held back (both databases).

0029's reverse drops soniq_key_parked, where a held-back keyed job keeps its
due time and its turn, and leaves the job queued at 9999-01-01: it would
never run. So ``soniq_downgrade`` and ``migrate soniq_django 0028`` refuse
(DowngradeRefused, QUEUE_SUBMISSION_CONFLICT, counts only) and change
nothing; once the held-back jobs have run (or been cancelled), they go on.
"""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection

from soniq_django import bulk_enqueue
from soniq_django.errors import ErrorCode
from soniq_django.keys.models import KeyParked
from soniq_django.models import Job
from soniq_django.producer.request import JobRequest
from soniq_django.schema.owned_metadata import DowngradeRefused
from tests.support.schema import applied_soniq_migrations, restore_latest


@pytest.fixture
def at_latest_afterwards(transactional_db):
    yield
    connection.close()
    restore_latest()


def held_back(count=3, key="tenant-secret-7"):
    """``count`` jobs of one key at a limit of 1: the first offered, the others held back."""
    bulk_enqueue([JobRequest("keys.down", {"n": n}, concurrency_key=key, key_concurrency=1)
                  for n in range(count)])
    assert KeyParked.objects.count() == count - 1


def test_soniq_downgrade_refuses_while_keyed_jobs_are_held_back(at_latest_afterwards):
    held_back()
    with pytest.raises(CommandError) as refused:
        call_command("soniq_downgrade", stdout=StringIO())
    message = str(refused.value)
    assert "keyed jobs held back by their keys' limits 2" in message
    assert "tenant-secret-7" not in message  # counts, never keys
    assert "0029_keys" in applied_soniq_migrations()
    assert KeyParked.objects.count() == 2 and Job.objects.count() == 3


def test_the_migration_reverse_refuses_too(at_latest_afterwards):
    held_back()
    with pytest.raises(DowngradeRefused) as refused:
        call_command("migrate", "soniq_django", "0028", verbosity=0)
    assert refused.value.code == ErrorCode.QUEUE_SUBMISSION_CONFLICT
    assert refused.value.retained.held_back_keyed_jobs == 2
    # (The migrations above 0029 were reversed, each in its own transaction, before it.)
    assert "0029_keys" in applied_soniq_migrations()
    assert KeyParked.objects.count() == 2


def test_the_reverse_goes_on_once_no_keyed_job_is_held_back(at_latest_afterwards):
    held_back(count=1)  # one keyed job, offered: nothing held back, a plain job below 0029
    call_command("migrate", "soniq_django", "0028", verbosity=0)
    assert "0029_keys" not in applied_soniq_migrations()
    assert Job.objects.filter(status="queued", scheduled_at__isnull=True).count() == 1
