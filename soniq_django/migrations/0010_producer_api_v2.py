"""The producer API, version 2 (PostgreSQL): see sql/producer_api_v2.sql.

soniq_enqueue keeps its contract with a cheaper body, and soniq_enqueue_many
enqueues a JSON array of jobs set-based. Reversing puts version 1 back.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0009_claim_protocol_v2")]

    operations = [
        RunWithoutModels(
            run_file("producer_api_v2.sql"),
            run_file("producer_api_v2.down.sql",
                     restore=(("producer_api_v1.sql", "soniq_enqueue"),)),
            elidable=False,
        ),
    ]
