"""Claim protocol v14: under a pinned horizon, the full probe for lapsed leases leaves the claim.

Runs sql/claim_protocol_v14.sql (PostgreSQL): soniq_claim_many's new body (a
session's probe from the start of the lease index, once hinted, every 300 s
instead of every 30 s) and soniq_settle_lapsed (that probe and its reaper,
which the workers' housekeeping calls once a minute). Reversing runs
claim_protocol_v14.down.sql, then puts version 13's soniq_claim_many back
(read from claim_protocol_v13.sql, with its settings). No table or index
changes; SQLite has no pinned horizon and nothing to change. See
docs/decisions/0053-the-full-lapsed-probe-leaves-the-claim.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0033_key_admit_exact'),
    ]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v14.sql"),
            run_file("claim_protocol_v14.down.sql", restore=(
                ("claim_protocol_v13.sql", "soniq_claim_many"),
            )),
            elidable=False,
        ),
    ]
