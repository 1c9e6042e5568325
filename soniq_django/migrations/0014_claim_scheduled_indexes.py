"""Claim protocol v6: a claim no longer reads the jobs scheduled for later.

The index soniq_jobs_claim_any_idx (priority, created_at of the queued jobs)
gives way to three on the queued jobs: soniq_jobs_claim_now_idx (the same
order, for the jobs not scheduled), soniq_jobs_claim_scheduled_idx (the same
order, for the scheduled ones) and soniq_jobs_claim_due_idx (the scheduled
ones by scheduled_at). Then sql/claim_protocol_v6.sql (PostgreSQL) gives
soniq_claim_many a body that reads them. A job not scheduled is in as many
claim indexes as before; a scheduled one in one more. Reversing puts
claim_protocol_v5.sql's soniq_claim_many back, then the old index in place of
the new ones. See docs/decisions/0018-claims-skip-scheduled-jobs.md.

The indexes are built with a plain CREATE INDEX, which holds off writes to
soniq_jobs while it runs (about a second per 100,000 queued jobs here).
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0013_queue_flow_control'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('scheduled_at__isnull', True), ('status', 'queued')), fields=['priority', 'created_at'], name='soniq_jobs_claim_now_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('scheduled_at__isnull', False), ('status', 'queued')), fields=['priority', 'created_at'], name='soniq_jobs_claim_scheduled_idx'),
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('scheduled_at__isnull', False), ('status', 'queued')), fields=['scheduled_at'], name='soniq_jobs_claim_due_idx'),
        ),
        RunWithoutModels(
            run_file("claim_protocol_v6.sql"),
            run_file("claim_protocol_v6.down.sql", restore=(
                ("claim_protocol_v5.sql", "soniq_claim_many"),
            )),
            elidable=False,
        ),
        migrations.RemoveIndex(
            model_name='job',
            name='soniq_jobs_claim_any_idx',
        ),
    ]
