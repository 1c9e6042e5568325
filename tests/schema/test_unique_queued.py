"""Migration 0022: soniq_jobs_unique_queued holds queued *unique* jobs only.

The index stops a second queued copy of a unique job, as before; a plain job
(``unique_job`` false) is no longer in it, so it writes no index entry -- the
WAL that saves is measured in docs/performance.md#wal-per-job. Both ways on
both databases, and a database without the index (a Soniq database adopted
with a faked 0001) gets none.
"""

import pytest
from django.db import IntegrityError, connection, transaction

from soniq_django.models import Job
from soniq_django.schema.admission import check_owned_schema
from tests.support.schema import execute, migrate

BEFORE = "0020"  # the migration 0022 follows
NAME = "soniq_jobs_unique_queued"


def unique_queued(**columns) -> Job:
    return Job.objects.create(job_name="a.b", args_hash="h", **columns)


def index_present() -> bool:
    with connection.cursor() as cursor:
        return NAME in connection.introspection.get_constraints(cursor, "soniq_jobs")


@pytest.mark.django_db
def test_a_plain_job_is_not_held_to_a_unique_jobs_hash():
    unique_queued(unique_job=True)
    unique_queued(unique_job=False)  # refused before 0022: it shared the index
    unique_queued(unique_job=False)
    with pytest.raises(IntegrityError), transaction.atomic():
        unique_queued(unique_job=True)
    assert Job.objects.filter(job_name="a.b", status="queued").count() == 3


def test_reversing_puts_the_old_condition_back_and_forward_again(at_latest_afterwards):
    migrate(BEFORE)
    unique_queued(unique_job=True)
    with pytest.raises(IntegrityError), transaction.atomic():
        unique_queued(unique_job=False)
    Job.objects.all().delete()
    migrate()
    unique_queued(unique_job=True)
    unique_queued(unique_job=False)
    with pytest.raises(IntegrityError), transaction.atomic():
        unique_queued(unique_job=True)
    assert check_owned_schema(connection) == []


def test_a_database_without_the_index_gets_none_either_way(at_latest_afterwards):
    execute(f"DROP INDEX {NAME}")
    migrate(BEFORE)
    assert not index_present()
    migrate()
    assert not index_present()
    execute(f"CREATE UNIQUE INDEX {NAME} ON soniq_jobs (job_name, args_hash) "
            f"WHERE status = 'queued' AND unique_job")
    assert index_present()
