"""Claim protocol v11: a completion finds its row by primary key, also under a pinned horizon.

sql/claim_protocol_v11.sql (PostgreSQL) gives soniq_complete_many a body
whose batch-of-one UPDATE writes its fence as one IS TRUE, so that the
planner finds the row by primary key, not through soniq_jobs_lease_idx,
which a held snapshot fills with dead leases. Same answers, errors, fences
and grants. Reversing puts version 8's soniq_complete_many
(claim_protocol_v8.sql) back. No table or index changes. See
docs/decisions/0037-indexes-after-a-pinned-horizon.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0022_jobs_created_idx'),
    ]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v11.sql"),
            run_file("claim_protocol_v11.down.sql", restore=(
                ("claim_protocol_v8.sql", "soniq_complete_many"),
            )),
            elidable=False,
        ),
    ]
