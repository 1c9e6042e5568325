"""Batched claims (PostgreSQL): soniq_claim_many, see sql/claim_protocol_v2.sql."""

from django.db import migrations

from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0008_soniq_job_tables")]

    operations = [
        migrations.RunPython(
            run_file("claim_protocol_v2.sql"),
            run_file("claim_protocol_v2.down.sql"),
            elidable=False,
        ),
    ]
