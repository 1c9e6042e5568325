"""Durable steps: the table soniq_job_steps, its fenced functions and its purge.

Adds the table soniq_job_steps (outside format 1: a job whose handler
recorded steps has one row per step, any other job none), then
sql/steps_v1.sql (PostgreSQL): soniq_get_step and soniq_record_step (the
lookup and the fenced record of a step) and the triggers that delete a
job's steps when the job has left both job tables; or sql/sqlite/steps_v1.sql
(SQLite): those triggers. Reversing drops them, then the table. See
docs/decisions/0046-durable-steps.md and docs/steps.md.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0027_enqueue_after_many'),
    ]

    operations = [
        migrations.CreateModel(
            name='JobStep',
            fields=[
                ('pk', models.CompositePrimaryKey('job_id', 'name', blank=True, editable=False,
                                                  primary_key=True, serialize=False)),
                ('job_id', models.UUIDField()),
                ('name', models.TextField()),
                ('result', models.JSONField(blank=True, null=True)),
                ('size', models.IntegerField()),
                ('attempt', models.IntegerField()),
                ('generation', models.BigIntegerField()),
                ('recorded_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'job step',
                'verbose_name_plural': 'job steps',
                'db_table': 'soniq_job_steps',
            },
        ),
        RunWithoutModels(
            run_file("steps_v1.sql"),
            run_file("steps_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("steps_v1.sql"),
            run_sqlite_file("steps_v1.down.sql"),
            elidable=False,
        ),
    ]
