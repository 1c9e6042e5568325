"""The claim protocol as SQL functions, and the protection trigger (PostgreSQL)."""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file

_drop_functions = run_file("claim_protocol_v1.down.sql")


def _guarded_reverse(apps, schema_editor):
    """Refuse (under the table lock) before dropping anything, exactly as 0003's reverse does.

    Without this, unapplying 0003 and 0004 together would drop the
    protection trigger in 0004's own transaction before 0003's reverse
    refused because protected submissions are still retained.
    """
    from soniq_django.schema.owned_metadata import lock_and_refuse_if_protected

    lock_and_refuse_if_protected(schema_editor.connection)
    _drop_functions(apps, schema_editor)


_guarded_reverse.sql_file = _drop_functions.sql_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0003_owned_queue")]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v1.sql"),
            _guarded_reverse,
            elidable=False,
        ),
    ]
