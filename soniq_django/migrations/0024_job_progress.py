"""Waiting and progress: the table soniq_job_progress, the waiters' table and their triggers.

Adds the table soniq_job_progress (outside format 1: a job whose handler
reported progress has a row, any other job none), then
sql/job_progress_v1.sql (PostgreSQL): the unlogged table soniq_job_waiters,
the triggers that NOTIFY a waiter when its job finishes (and only when one
waits), soniq_set_progress (the fenced progress write) and the triggers that
delete a job's progress when the job has left both job tables; or
sql/sqlite/job_progress_v1.sql (SQLite): those last triggers. Reversing
drops them, then the table. See docs/decisions/0043-waiting-and-progress.md
and docs/workflows.md.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0023_claim_protocol_v11'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobProgress',
            fields=[
                ('job_id', models.UUIDField(primary_key=True, serialize=False)),
                ('done', models.BigIntegerField()),
                ('total', models.BigIntegerField(blank=True, null=True)),
                ('note', models.TextField(blank=True, null=True)),
                ('updated_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'job progress',
                'verbose_name_plural': 'job progress',
                'db_table': 'soniq_job_progress',
            },
        ),
        RunWithoutModels(
            run_file("job_progress_v1.sql"),
            run_file("job_progress_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("job_progress_v1.sql"),
            run_sqlite_file("job_progress_v1.down.sql"),
            elidable=False,
        ),
    ]
