"""Owned-queue metadata, additive (see soniq_django.schema.owned_metadata).

The database side is hand-written so that it can check what already exists
before changing anything, and so that its reverse is the controlled
downgrade; the state side is what Django derives from the models.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.schema.owned_metadata import migrate_forward, migrate_backward


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0002_producer_api'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                RunWithoutModels(migrate_forward, migrate_backward, elidable=False),
            ],
            state_operations=[
            migrations.AddField(
                model_name='deadletterjob',
                name='fence_required',
                field=models.BooleanField(db_default=False, default=False, editable=False),
            ),
            migrations.AddField(
                model_name='deadletterjob',
                name='submission_fingerprint',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddField(
                model_name='deadletterjob',
                name='submission_id',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='active_key',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='cancel_requested',
                field=models.BooleanField(db_default=False, default=False, editable=False),
            ),
            migrations.AddField(
                model_name='job',
                name='claim_generation',
                field=models.BigIntegerField(db_default=0, default=0, editable=False),
            ),
            migrations.AddField(
                model_name='job',
                name='claim_owner',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='claim_token',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='fence_required',
                field=models.BooleanField(db_default=False, default=False, editable=False),
            ),
            migrations.AddField(
                model_name='job',
                name='lease_expires_at',
                field=models.DateTimeField(blank=True, editable=False, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='pid',
                field=models.IntegerField(blank=True, editable=False, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='submission_fingerprint',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddField(
                model_name='job',
                name='submission_id',
                field=models.CharField(blank=True, editable=False, max_length=255, null=True),
            ),
            migrations.AddIndex(
                model_name='job',
                index=models.Index(condition=models.Q(('status', 'processing')), fields=['lease_expires_at'], name='soniq_jobs_lease_idx'),
            ),
            migrations.AddConstraint(
                model_name='deadletterjob',
                constraint=models.UniqueConstraint(fields=('submission_id',), name='soniq_dlq_submission_id_key'),
            ),
            migrations.AddConstraint(
                model_name='job',
                constraint=models.UniqueConstraint(fields=('claim_token',), name='soniq_jobs_claim_token_key'),
            ),
            migrations.AddConstraint(
                model_name='job',
                constraint=models.UniqueConstraint(fields=('submission_id',), name='soniq_jobs_submission_id_key'),
            ),
            migrations.AddConstraint(
                model_name='job',
                constraint=models.UniqueConstraint(condition=models.Q(('status__in', ['queued', 'processing']), ('active_key__isnull', False)), fields=('active_key',), name='soniq_jobs_active_key_live'),
            ),
            migrations.AddConstraint(
                model_name='job',
                constraint=models.CheckConstraint(condition=models.Q(('claim_generation__gte', 0)), name='soniq_jobs_generation_not_negative'),
            ),
            ],
        ),
    ]
