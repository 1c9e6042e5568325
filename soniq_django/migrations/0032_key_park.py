"""Limits per key for the jobs that reach their key later: replayed dead letters, dependents.

Adds soniq_dead_letter_jobs.concurrency_key (nullable, no default: a catalog
change, no rewrite; outside format 1's columns), then sql/key_park_v1.sql
(PostgreSQL: soniq_key_park_v1, the trigger that gives a dead letter its
job's key, soniq_settle_dependents_v2 behind the workflow triggers, and
soniq_enqueue_keyed_after) or sql/sqlite/key_park_v1.sql (its SQLite twin).
Reversing puts the workflow triggers back on v1, drops the rest, then the
column. See docs/keys.md.
"""

from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0031_key_lock_order'),
    ]

    operations = [
        migrations.AddField(
            model_name='deadletterjob',
            name='concurrency_key',
            field=models.TextField(blank=True, editable=False, null=True),
        ),
        RunWithoutModels(
            run_file("key_park_v1.sql"),
            run_file("key_park_v1.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("key_park_v1.sql"),
            run_sqlite_file("key_park_v1.down.sql"),
            elidable=False,
        ),
    ]
