"""Claim protocol v9: claims whose cost does not grow under a pinned horizon.

Runs sql/claim_protocol_v9.sql (PostgreSQL): soniq_claim_many's new body and
soniq_reap_lapsed_v3. Reversing runs claim_protocol_v9.down.sql, then puts
version 8's soniq_claim_many back (read from claim_protocol_v8.sql). No table
or index changes. See docs/decisions/0035-claims-under-a-pinned-horizon.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0018_claim_protocol_v8'),
    ]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v9.sql"),
            run_file("claim_protocol_v9.down.sql", restore=(
                ("claim_protocol_v8.sql", "soniq_claim_many"),
            )),
            elidable=False,
        ),
    ]
