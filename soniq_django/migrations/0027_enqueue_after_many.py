"""Many jobs that wait for others in one call: soniq_enqueue_after_many.

Loads sql/producer_api_v6.sql (PostgreSQL only: on SQLite bulk_enqueue's
twin is Python, producer/dependencies.py). Reversing drops the function.
See docs/decisions/0045-set-based-dependents.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0026_workflow_purge'),
    ]

    operations = [
        RunWithoutModels(
            run_file("producer_api_v6.sql"),
            run_file("producer_api_v6.down.sql"),
            elidable=False,
        ),
    ]
