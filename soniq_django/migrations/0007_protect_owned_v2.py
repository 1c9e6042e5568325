"""The protection trigger, version 2 (PostgreSQL): see sql/protect_owned_v2.sql.

A row a Soniq 0.1.0 worker claimed after a soniq_django retry is no longer
mistaken for a live owned claim, and an id-only claim of an owned submission
fails instead of being skipped while its handler runs anyway.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0006_soniq_worker_tables")]

    operations = [
        RunWithoutModels(
            run_file("protect_owned_v2.sql"),
            run_file("protect_owned_v2.down.sql"),
            elidable=False,
        ),
    ]
