"""Flow control per queue: soniq_queue_settings, soniq_queue_starts, claim protocol v5.

The two tables, then sql/claim_protocol_v5.sql (PostgreSQL): soniq_claim_many
skips paused queues and starts at most what a queue's concurrency and rate
limits leave (soniq_queue_budget_v1, under the queue's row lock). Reversing
puts claim_protocol_v2.sql's soniq_claim_many back, drops the helper, then
the tables. See docs/decisions/0016-queue-flow-control.md.
"""

import django.db.models.functions.datetime
import django.utils.timezone
from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0012_claim_protocol_v4'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueueSetting',
            fields=[
                ('queue', models.TextField(primary_key=True, serialize=False)),
                ('paused', models.BooleanField(db_default=False, default=False, help_text="Claims skip this queue's jobs on every worker; running jobs finish.")),
                ('paused_at', models.DateTimeField(blank=True, null=True)),
                ('paused_by', models.TextField(blank=True, null=True)),
                ('concurrency', models.IntegerField(blank=True, help_text="At most this many of the queue's jobs run at once, across all workers. Empty: SONIQ['QUEUES'] decides.", null=True)),
                ('rate_limit', models.IntegerField(blank=True, help_text="At most this many of the queue's jobs start in any window of rate period seconds, across all workers. Empty: SONIQ['QUEUES'] decides.", null=True)),
                ('rate_period', models.IntegerField(blank=True, help_text='Seconds (1 for a rate per second, 60 per minute).', null=True)),
                ('configured_concurrency', models.IntegerField(blank=True, editable=False, null=True)),
                ('configured_rate_limit', models.IntegerField(blank=True, editable=False, null=True)),
                ('configured_rate_period', models.IntegerField(blank=True, editable=False, null=True)),
                ('updated_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'queue setting',
                'db_table': 'soniq_queue_settings',
                'constraints': [models.CheckConstraint(condition=models.Q(('concurrency__isnull', True), ('concurrency__gte', 1), _connector='OR'), name='soniq_queue_concurrency_positive'), models.CheckConstraint(condition=models.Q(('configured_concurrency__isnull', True), ('configured_concurrency__gte', 1), _connector='OR'), name='soniq_queue_configured_concurrency_positive'), models.CheckConstraint(condition=models.Q(models.Q(('rate_limit__isnull', True), ('rate_period__isnull', True)), models.Q(('rate_limit__gte', 1), ('rate_period__gte', 1), ('rate_period__lte', 86400)), _connector='OR'), name='soniq_queue_rate_valid'), models.CheckConstraint(condition=models.Q(models.Q(('configured_rate_limit__isnull', True), ('configured_rate_period__isnull', True)), models.Q(('configured_rate_limit__gte', 1), ('configured_rate_period__gte', 1), ('configured_rate_period__lte', 86400)), _connector='OR'), name='soniq_queue_configured_rate_valid')],
            },
        ),
        migrations.CreateModel(
            name='QueueStart',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('queue', models.TextField()),
                ('started_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'queue start',
                'db_table': 'soniq_queue_starts',
                'indexes': [models.Index(fields=['queue', 'started_at'], name='soniq_queue_starts_idx')],
            },
        ),
        RunWithoutModels(
            run_file("claim_protocol_v5.sql"),
            run_file("claim_protocol_v5.down.sql", restore=(
                ("claim_protocol_v2.sql", "soniq_claim_many"),
            )),
            elidable=False,
        ),
    ]
