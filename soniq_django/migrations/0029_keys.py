"""Limits per key: soniq_jobs.concurrency_key and the key tables, then their triggers.

Adds soniq_jobs.concurrency_key (nullable, no default: a catalog change, no
rewrite; outside format 1's columns), the tables soniq_key_slots,
soniq_key_limits, soniq_key_parked, soniq_key_starts and soniq_key_holds,
then sql/claim_protocol_v12.sql (PostgreSQL: soniq_enqueue_keyed and the
triggers that keep each key's slots) or sql/sqlite/claim_protocol_v12.sql
(its SQLite twin). Reversing refuses while keyed jobs are held back
(DowngradeRefused: they would stay parked), then drops the triggers and
functions, then the tables and the column. See
docs/decisions/0047-limits-per-key.md.
"""

import django.db.models.functions.datetime
import django.utils.timezone
from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.schema.owned_metadata import refuse_held_back_keyed_jobs
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0028_job_steps'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='concurrency_key',
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name='KeySlot',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.TextField()),
                ('key', models.TextField()),
                ('running', models.IntegerField(db_default=0, default=0)),
                ('head', models.UUIDField(blank=True, null=True)),
                ('head_run_at', models.DateTimeField(blank=True, null=True)),
                ('configured_concurrency', models.IntegerField(blank=True, null=True)),
                ('configured_rate_limit', models.IntegerField(blank=True, null=True)),
                ('configured_rate_period', models.IntegerField(blank=True, null=True)),
                ('pokes', models.BigIntegerField(db_default=0, default=0)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'key',
                'db_table': 'soniq_key_slots',
                'constraints': [
                    models.UniqueConstraint(fields=('queue', 'key'), name='soniq_key_slots_key'),
                    models.CheckConstraint(condition=models.Q(('configured_concurrency__isnull', True), ('configured_concurrency__gte', 1), _connector='OR'), name='soniq_key_slots_concurrency_valid'),
                    models.CheckConstraint(condition=models.Q(models.Q(('configured_rate_limit__isnull', True), ('configured_rate_period__isnull', True)), models.Q(('configured_rate_limit__gte', 1), ('configured_rate_period__gte', 1), ('configured_rate_period__lte', 86400)), _connector='OR'), name='soniq_key_slots_rate_valid'),
                ],
            },
        ),
        migrations.CreateModel(
            name='KeyLimit',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.TextField()),
                ('key_pattern', models.TextField()),
                ('concurrency', models.IntegerField(blank=True, help_text="At most this many jobs of a matching key run at once. Empty: the jobs' @job(key_concurrency=...) decides.", null=True)),
                ('rate_limit', models.IntegerField(blank=True, help_text="At most this many starts of a matching key in any window of rate period seconds. Empty: the jobs' @job(key_rate=...) decides.", null=True)),
                ('rate_period', models.IntegerField(blank=True, help_text='Seconds (1 for a rate per second, 60 per minute).', null=True)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'key limit',
                'db_table': 'soniq_key_limits',
                'constraints': [
                    models.UniqueConstraint(fields=('queue', 'key_pattern'), name='soniq_key_limits_pattern'),
                    models.CheckConstraint(condition=models.Q(('concurrency__isnull', True), ('concurrency__gte', 1), _connector='OR'), name='soniq_key_limits_concurrency_valid'),
                    models.CheckConstraint(condition=models.Q(models.Q(('rate_limit__isnull', True), ('rate_period__isnull', True)), models.Q(('rate_limit__gte', 1), ('rate_period__gte', 1), ('rate_period__lte', 86400)), _connector='OR'), name='soniq_key_limits_rate_valid'),
                ],
            },
        ),
        migrations.CreateModel(
            name='KeyParked',
            fields=[
                ('job_id', models.UUIDField(primary_key=True, serialize=False)),
                ('queue', models.TextField()),
                ('key', models.TextField()),
                ('priority', models.IntegerField()),
                ('created_at', models.DateTimeField()),
                ('run_at', models.DateTimeField(blank=True, null=True)),
            ],
            options={
                'verbose_name': 'parked keyed job',
                'db_table': 'soniq_key_parked',
                'indexes': [models.Index(fields=['queue', 'key', 'priority', 'created_at'], name='soniq_key_parked_order_idx'), models.Index(fields=['queue', 'key', 'run_at'], name='soniq_key_parked_due_idx'), models.Index(condition=models.Q(('run_at__isnull', True)), fields=['queue', 'key', 'priority', 'created_at'], name='soniq_key_parked_now_idx')],
            },
        ),
        migrations.CreateModel(
            name='KeyStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.TextField()),
                ('key', models.TextField()),
                ('started_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'key start',
                'db_table': 'soniq_key_starts',
                'indexes': [models.Index(fields=['queue', 'key', 'started_at'], name='soniq_key_starts_idx')],
            },
        ),
        migrations.CreateModel(
            name='KeyHold',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_id', models.UUIDField()),
                ('generation', models.BigIntegerField()),
                ('queue', models.TextField()),
                ('key', models.TextField()),
            ],
            options={
                'verbose_name': 'key hold',
                'db_table': 'soniq_key_holds',
                'constraints': [models.UniqueConstraint(fields=('job_id', 'generation'), name='soniq_key_holds_claim')],
            },
        ),
        RunWithoutModels(
            run_file("claim_protocol_v12.sql"),
            run_file("claim_protocol_v12.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("claim_protocol_v12.sql"),
            run_sqlite_file("claim_protocol_v12.down.sql"),
            elidable=False,
        ),
        # Reversed first: refused while keyed jobs are held back, which the reverse would
        # leave queued at 9999-01-01 with nothing to offer them (added after release;
        # forwards it does nothing).
        RunWithoutModels(
            migrations.RunPython.noop,
            refuse_held_back_keyed_jobs,
            elidable=False,
        ),
    ]
