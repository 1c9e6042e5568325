"""Claim protocol v8: bounded waits, and slots held by timed-out handlers.

Creates soniq_queue_holds (a limited queue's slot kept by a handler that ran
on past its time limit), then runs sql/claim_protocol_v8.sql (PostgreSQL).
Reversing runs claim_protocol_v8.down.sql, puts back the released bodies of
the functions version 8 replaced, then drops the table. See
docs/decisions/0029-claim-protocol-v8.md.

The claim's part: the index soniq_jobs_claim_queue_now_idx ((queue, priority,
created_at) of the unscheduled queued jobs) is added before the SQL runs, so
that a claim scans each queue it serves on its own, and dropped after the
reverse has put version 7's soniq_claim_many and soniq_complete_many back
(read from claim_protocol_v7.sql). Built with a plain CREATE INDEX, which
holds off writes to soniq_jobs while it runs (about a second per 100,000
queued jobs).
"""

import django.db.models.functions.datetime
import django.utils.timezone
from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0017_producer_api_v4'),
    ]

    operations = [
        migrations.CreateModel(
            name='QueueHold',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_id', models.UUIDField()),
                ('generation', models.BigIntegerField()),
                ('queue', models.TextField()),
                ('claim_owner', models.TextField()),
                ('lease_expires_at', models.DateTimeField()),
                ('created_at', models.DateTimeField(db_default=django.db.models.functions.datetime.Now(), default=django.utils.timezone.now)),
            ],
            options={
                'verbose_name': 'queue hold',
                'db_table': 'soniq_queue_holds',
                'indexes': [models.Index(fields=['queue', 'lease_expires_at'], name='soniq_queue_holds_queue_idx')],
                'constraints': [models.UniqueConstraint(fields=('job_id', 'generation'), name='soniq_queue_holds_claim_uniq')],
            },
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('scheduled_at__isnull', True), ('status', 'queued')), fields=['queue', 'priority', 'created_at'], name='soniq_jobs_claim_queue_now_idx'),
        ),
        RunWithoutModels(
            run_file("claim_protocol_v8.sql"),
            run_file("claim_protocol_v8.down.sql", restore=(
                ("claim_protocol_v7.sql", "soniq_claim_many"),
                ("claim_protocol_v7.sql", "soniq_complete_many"),
                ("claim_protocol_v4.sql", "soniq_defer"),
            )),
            elidable=False,
        ),
    ]
