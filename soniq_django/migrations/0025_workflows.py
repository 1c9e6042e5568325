"""Workflows: dependencies between jobs, batches with a callback, chains.

Adds soniq_jobs.has_dependents (nullable, no default: a catalog change, no
rewrite), the tables soniq_job_dependencies, soniq_job_waits, soniq_batches
and soniq_batch_members, then sql/workflows_v1.sql (PostgreSQL; the triggers
that settle a job's dependents in the transaction of the write that ends it)
or sql/sqlite/workflows_v1.sql (its SQLite twin), and sql/producer_api_v5.sql
(PostgreSQL: soniq_enqueue_after). Reversing drops the functions and
triggers, then the tables and the column. See
docs/decisions/0044-workflows.md.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0024_job_progress'),
    ]

    operations = [
        migrations.CreateModel(
            name='Batch',
            fields=[
                ('id', models.UUIDField(primary_key=True, serialize=False)),
                ('size', models.IntegerField()),
                ('callback_id', models.UUIDField(blank=True, null=True, unique=True)),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'batch',
                'verbose_name_plural': 'batches',
                'db_table': 'soniq_batches',
            },
        ),
        migrations.CreateModel(
            name='JobWait',
            fields=[
                ('job_id', models.UUIDField(primary_key=True, serialize=False)),
                ('pending', models.IntegerField()),
                ('run_at', models.DateTimeField(blank=True, null=True)),
                ('created_at', models.DateTimeField()),
            ],
            options={
                'verbose_name': 'waiting job',
                'db_table': 'soniq_job_waits',
            },
        ),
        migrations.AddField(
            model_name='job',
            name='has_dependents',
            field=models.BooleanField(blank=True, editable=False, null=True),
        ),
        migrations.CreateModel(
            name='BatchMember',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('batch_id', models.UUIDField()),
                ('position', models.IntegerField()),
                ('job_id', models.UUIDField()),
            ],
            options={
                'verbose_name': 'batch member',
                'db_table': 'soniq_batch_members',
                'indexes': [models.Index(fields=['job_id'], name='soniq_batch_members_job_idx')],
                'constraints': [models.UniqueConstraint(fields=('batch_id', 'position'), name='soniq_batch_members_pos')],
            },
        ),
        migrations.CreateModel(
            name='JobDependency',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('job_id', models.UUIDField()),
                ('depends_on', models.UUIDField()),
                ('any_outcome', models.BooleanField(default=False)),
                ('state', models.TextField(choices=[('waiting', 'waiting'), ('done', 'done'), ('failed', 'failed (cancelled or dead-lettered)')])),
            ],
            options={
                'verbose_name': 'job dependency',
                'verbose_name_plural': 'job dependencies',
                'db_table': 'soniq_job_dependencies',
                'indexes': [models.Index(fields=['depends_on'], name='soniq_job_dependencies_on_idx')],
                'constraints': [models.UniqueConstraint(fields=('job_id', 'depends_on'), name='soniq_job_dependencies_pair')],
            },
        ),
        RunWithoutModels(
            run_file("workflows_v1.sql"),
            run_file("workflows_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("workflows_v1.sql"),
            run_sqlite_file("workflows_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_file("producer_api_v5.sql"),
            run_file("producer_api_v5.down.sql"),
            elidable=False,
        ),
    ]
