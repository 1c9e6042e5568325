"""Trace contexts: the table soniq_job_trace and the triggers that take its rows with the job.

Adds the table (outside format 1: a job enqueued under a recording
OpenTelemetry span has a row, any other job none), then sql/job_trace_v1.sql
(PostgreSQL) or sql/sqlite/job_trace_v1.sql (SQLite): the triggers that
delete a job's row when the job has left both job tables. Reversing drops
the triggers, then the table. See
docs/decisions/0041-tracing-through-the-queue.md and docs/tracing.md.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0020_attempts'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobTrace',
            fields=[
                ('job_id', models.UUIDField(primary_key=True, serialize=False)),
                ('traceparent', models.CharField(max_length=128)),
                ('tracestate', models.CharField(blank=True, max_length=512, null=True)),
            ],
            options={
                'verbose_name': 'job trace context',
                'db_table': 'soniq_job_trace',
            },
        ),
        RunWithoutModels(
            run_file("job_trace_v1.sql"),
            run_file("job_trace_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("job_trace_v1.sql"),
            run_sqlite_file("job_trace_v1.down.sql"),
            elidable=False,
        ),
    ]
