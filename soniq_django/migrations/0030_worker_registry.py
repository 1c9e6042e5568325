"""Workers in any language: registration, heartbeat and the outcome of a claim, in SQL.

Loads sql/worker_registry_v1.sql (PostgreSQL): soniq_register_worker,
soniq_worker_heartbeat and soniq_claim_outcome, SECURITY DEFINER, so that a
worker's role needs EXECUTE only (soniq_grant --worker). SQLite has no SQL
API: soniq_django's worker registers there through its Python twin
(worker/registration.py). Reversing drops the three functions. See
docs/decisions/0048-workers-in-any-language.md and docs/claim-protocol.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0029_keys'),
    ]

    operations = [
        RunWithoutModels(
            run_file("worker_registry_v1.sql"),
            run_file("worker_registry_v1.down.sql"),
            elidable=False,
        ),
    ]
