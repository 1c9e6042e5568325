"""soniq_jobs' storage parameters on PostgreSQL: vacuum after 1,000 + 1% dead rows, not 50 + 20%.

``ALTER TABLE soniq_jobs SET (...)`` with ``PARAMETERS``; reversing RESETs
exactly those (whatever their value by then), leaving any other parameter an
operator set alone. Storage parameters are not part of the storage format
(SPEC's columns, indexes and constraints are unchanged; the admission check
passes either way). The lock is SHARE UPDATE EXCLUSIVE: reads and writes go
on while it runs. SQLite has no such parameters: there the migration does
nothing but is recorded. Why these values: docs/decisions/0020-storage-tuning.md.
"""

from django.db import migrations
from soniq_django.schema.operations import RunWithoutModels

TABLE = "soniq_jobs"

#: The values, as PostgreSQL stores them in pg_class.reloptions.
PARAMETERS = {
    "autovacuum_vacuum_scale_factor": "0.01",
    "autovacuum_vacuum_threshold": "1000",
}


def tune(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    values = ", ".join(f"{key} = {value}" for key, value in PARAMETERS.items())
    schema_editor.execute(f"ALTER TABLE {schema_editor.quote_name(TABLE)} SET ({values})")


def untune(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute(
        f"ALTER TABLE {schema_editor.quote_name(TABLE)} RESET ({', '.join(PARAMETERS)})")


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0014_claim_scheduled_indexes'),
    ]

    operations = [
        RunWithoutModels(tune, untune, elidable=False),
    ]
