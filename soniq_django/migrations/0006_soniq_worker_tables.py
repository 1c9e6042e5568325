"""soniq_workers and soniq_task_registry take Soniq 0.1.0's own shape (see soniq_django.schema.worker_tables).

On PostgreSQL a hand-written step transforms soniq_django's 0001 tables, or
leaves Soniq's own tables (an adopted database) as they are and adds what
soniq_django needs; elsewhere Django's operations below do it. The state is
the same either way.
"""

import django.utils.timezone
from django.db import migrations, models

import soniq_django.fields
from soniq_django.schema import worker_tables
from soniq_django.schema.operations import RunWithoutModels


class Migration(migrations.Migration):

    dependencies = [
        ("soniq_django", "0005_throughput"),
    ]

    operations = [
        worker_tables.ForVendors(
            postgresql=[
                RunWithoutModels(worker_tables.postgresql_forward,
                                     worker_tables.postgresql_backward, elidable=False),
            ],
            operations=[
                RunWithoutModels(worker_tables.sqlite_before,
                                     worker_tables.sqlite_after_backward, elidable=False),
                migrations.RenameField(
                    model_name="worker", old_name="last_heartbeat_at", new_name="last_heartbeat",
                ),
                migrations.RemoveField(model_name="worker", name="stopped_at"),
                migrations.AlterField(
                    model_name="worker",
                    name="queues",
                    field=soniq_django.fields.QueueListField(
                        blank=True, default=list, null=True,
                        help_text="Queue names; empty (or null) for every queue."),
                ),
                migrations.AlterField(
                    model_name="worker",
                    name="status",
                    field=models.TextField(
                        choices=[("active", "Active"), ("stopping", "Stopping"),
                                 ("stopped", "Stopped")],
                        db_default="active", default="active"),
                ),
                migrations.AddField(
                    model_name="worker",
                    name="version",
                    field=models.TextField(
                        blank=True, null=True,
                        help_text="Who runs it; soniq_django writes its name and version."),
                ),
                migrations.AddField(
                    model_name="worker",
                    name="metadata",
                    field=models.JSONField(blank=True, db_default={}, default=dict, null=True),
                ),
                migrations.AddConstraint(
                    model_name="worker",
                    constraint=models.UniqueConstraint(
                        fields=("hostname", "pid"), name="idx_soniq_workers_host_pid"),
                ),
                migrations.AddConstraint(
                    model_name="worker",
                    constraint=models.CheckConstraint(
                        condition=models.Q(("status__in", ["active", "stopping", "stopped"])),
                        name="soniq_workers_status_check"),
                ),
                migrations.DeleteModel(name="TaskRegistration"),
                migrations.CreateModel(
                    name="TaskRegistration",
                    fields=[
                        ("pk", models.CompositePrimaryKey(
                            "task_name", "worker_id", blank=True, editable=False,
                            primary_key=True, serialize=False)),
                        ("task_name", models.TextField()),
                        ("worker_id", models.TextField()),
                        ("last_seen_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("args_model_repr", models.TextField(blank=True, null=True)),
                        ("queue", models.TextField(blank=True, null=True)),
                        ("max_attempts", models.IntegerField(blank=True, null=True)),
                        ("unique_job", models.BooleanField(blank=True, null=True)),
                    ],
                    options={
                        "verbose_name": "registered task",
                        "db_table": "soniq_task_registry",
                    },
                ),
                RunWithoutModels(worker_tables.create_soniq_indexes,
                                     worker_tables.drop_soniq_indexes, elidable=False),
            ],
        ),
    ]
