"""Batched claims and completions (PostgreSQL), see sql/claim_protocol_v2.sql.

Reversing drops the new functions and puts version 1's soniq_complete back.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0008_soniq_job_tables")]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v2.sql"),
            run_file("claim_protocol_v2.down.sql",
                     restore=(("claim_protocol_v1.sql", "soniq_complete"),)),
            elidable=False,
        ),
    ]
