"""The SQL producer API (PostgreSQL): soniq_enqueue, soniq_get_job, soniq_args_hash."""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0001_format1")]

    operations = [
        RunWithoutModels(
            # A database Soniq 0.2 created has its own three public functions
            # under these names and signatures: replace them (docs/interop.md).
            run_file("producer_api_v1.sql",
                     adopt=("soniq_args_hash", "soniq_enqueue", "soniq_get_job")),
            run_file("producer_api_v1.down.sql"),
            elidable=False,
        ),
    ]
