"""Attempt history: soniq_jobs.claimed_at, soniq_job_attempts, claim protocol v10.

Adds the column (nullable, no default: a catalog change, no rewrite) and the
table, then sql/claim_protocol_v10.sql (PostgreSQL: soniq_claim_many writes
claimed_at) and sql/attempts_v1.sql (PostgreSQL) or sql/sqlite/attempts_v1.sql
(SQLite): the triggers that record an attempt which ended without finishing
its job, and take a job's rows with it. Reversing drops the triggers, puts
version 9's soniq_claim_many back, then drops the table and the column. See
docs/decisions/0034-attempt-history.md.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0019_claim_protocol_v9'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='claimed_at',
            field=models.DateTimeField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name='JobAttempt',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_id', models.UUIDField()),
                ('attempt', models.IntegerField()),
                ('generation', models.BigIntegerField()),
                ('worker_id', models.UUIDField(blank=True, null=True)),
                ('claim_owner', models.CharField(blank=True, max_length=255, null=True)),
                ('claimed_at', models.DateTimeField(blank=True, null=True)),
                ('ended_at', models.DateTimeField()),
                ('outcome', models.TextField(choices=[('failed', 'failed (retried)'), ('lapsed', 'lease lapsed'), ('deferred', 'deferred (handler unknown here)'), ('dead', 'dead-lettered')])),
                ('dead_letter_reason', models.TextField(blank=True, null=True)),
                ('error', models.TextField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'job attempt',
                'db_table': 'soniq_job_attempts',
                'indexes': [models.Index(fields=['job_id', 'id'], name='soniq_job_attempts_job_idx')],
            },
        ),
        RunWithoutModels(
            run_file("claim_protocol_v10.sql"),
            run_file("claim_protocol_v10.down.sql", restore=(
                ("claim_protocol_v9.sql", "soniq_claim_many"),
            )),
            elidable=False,
        ),
        RunWithoutModels(
            run_file("attempts_v1.sql"),
            run_file("attempts_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("attempts_v1.sql"),
            run_sqlite_file("attempts_v1.down.sql"),
            elidable=False,
        ),
    ]
