"""The claim protocol as SQL functions, and the protection trigger (PostgreSQL)."""

from django.db import migrations

from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0003_owned_queue")]

    operations = [
        migrations.RunPython(
            run_file("claim_protocol_v1.sql"),
            run_file("claim_protocol_v1.down.sql"),
            elidable=False,
        ),
    ]
