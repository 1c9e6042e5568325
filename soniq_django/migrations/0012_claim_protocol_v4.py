"""Giving a claim back (PostgreSQL): soniq_defer, see sql/claim_protocol_v4.sql.

A worker that cannot run a job it claimed (no handler for its name, during a
rolling deploy) queues it again for later without spending an attempt.
Reversing drops the function; no released body changed.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0011_protocol_edges")]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v4.sql"),
            run_file("claim_protocol_v4.down.sql"),
            elidable=False,
        ),
    ]
