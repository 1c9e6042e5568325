"""Claim protocol v13: waits on key rows in one order, and a claim never waits for one.

sql/claim_protocol_v13.sql (PostgreSQL) adds soniq_key_lock_v1 (lock keys'
rows in key order) and soniq_queue_budget_v3, and gives soniq_claim_many,
soniq_complete_many, soniq_hold_slot and soniq_key_sweep new bodies (same
signatures, answers and grants): a claim takes a key's row with SKIP LOCKED
and leaves a job whose key is held elsewhere; a write that ends the runs of
several keys locks their rows first, in key order. So two rounds that
complete and claim jobs of several keys cannot deadlock. No table changes;
SQLite has one writer at a time and nothing to change. Reversing drops the
two functions, puts back the released bodies (versions 10, 11, 8 and 12),
then soniq_claim_many's settings of version 11. See
docs/decisions/0049-key-rows-locked-in-one-order.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0030_worker_registry'),
    ]

    operations = [
        # Reversed last: the settings of the claim function restored below.
        RunWithoutModels(
            migrations.RunPython.noop,
            run_file("claim_protocol_v13.settings.down.sql"),
            elidable=False,
        ),
        RunWithoutModels(
            run_file("claim_protocol_v13.sql"),
            run_file("claim_protocol_v13.down.sql", restore=(
                ("claim_protocol_v10.sql", "soniq_claim_many"),
                ("claim_protocol_v11.sql", "soniq_complete_many"),
                ("claim_protocol_v8.sql", "soniq_hold_slot"),
                ("claim_protocol_v12.sql", "soniq_key_sweep"),
            )),
            elidable=False,
        ),
    ]
