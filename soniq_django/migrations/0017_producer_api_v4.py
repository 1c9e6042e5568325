"""Producer API v4: a plain job is checked by one IF and written (and notified) by one INSERT.

sql/producer_api_v4.sql (PostgreSQL) gives soniq_enqueue a body that reads
the database's settings row once and, for a plain job whose inputs pass
every check (one IF), inserts the job and notifies by one INSERT; every
other call runs version 3's body. Same signature, results, errors (and their
order), grants and trust model. Reversing puts version 3's soniq_enqueue
(producer_api_v3.sql) back. No table or index changes. See
docs/decisions/0027-plain-enqueue-fast-path.md.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0016_claim_protocol_v7'),
    ]

    operations = [
        RunWithoutModels(
            run_file("producer_api_v4.sql"),
            run_file("producer_api_v4.down.sql", restore=(
                ("producer_api_v3.sql", "soniq_enqueue"),
            )),
            elidable=False,
        ),
    ]
