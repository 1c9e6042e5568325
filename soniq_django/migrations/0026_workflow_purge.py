"""A job's workflow rows go with it.

Loads sql/workflows_v2.sql (PostgreSQL: statement triggers on DELETE of
soniq_jobs and soniq_dead_letter_jobs) or sql/sqlite/workflows_v2.sql (its
SQLite twin, row triggers): when a job is gone from both job tables -- a
purge of expired rows or of old dead letters, an operator's DELETE -- its
soniq_job_waits row goes, an edge of soniq_job_dependencies goes once both
its ends are gone, and a batch (with its soniq_batch_members rows) once its
callback and every member are gone. Reversing drops the triggers. See
docs/decisions/0044-workflows.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0025_workflows'),
    ]

    operations = [
        RunWithoutModels(
            run_file("workflows_v2.sql"),
            run_file("workflows_v2.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("workflows_v2.sql"),
            run_sqlite_file("workflows_v2.down.sql"),
            elidable=False,
        ),
    ]
