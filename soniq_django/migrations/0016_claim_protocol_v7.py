"""Claim protocol v7: a batch of claims or completions is written by one UPDATE.

sql/claim_protocol_v7.sql (PostgreSQL) gives soniq_claim_many and
soniq_complete_many bodies that, for a batch of more than one job, lock the
rows as before and write them with one UPDATE matched by the ctid of the
rows locked, instead of one UPDATE per job. Same answers, errors, fences and
grants; a batch of one keeps the per-row path. Reversing puts version 6's
soniq_claim_many (claim_protocol_v6.sql) and version 2's soniq_complete_many
(claim_protocol_v2.sql) back. No table or index changes. See
docs/decisions/0026-set-based-batch-writes.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0015_storage_tuning'),
    ]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v7.sql"),
            run_file("claim_protocol_v7.down.sql", restore=(
                ("claim_protocol_v6.sql", "soniq_claim_many"),
                ("claim_protocol_v2.sql", "soniq_complete_many"),
            )),
            elidable=False,
        ),
    ]
