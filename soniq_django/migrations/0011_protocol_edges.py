"""The protocol's edges (PostgreSQL): see sql/claim_protocol_v3.sql and sql/producer_api_v3.sql.

A retry whose key a queued twin holds is finished as superseded instead of
failing; the reaper settles each lapsed row on its own and counts lapsed
claims against the job's attempt limit; the dead-letter move keeps a
protected identity; soniq_request_cancel answers false for an unknown id;
an id held by a dead-lettered job is taken; soniq_claim becomes a batch of
one of soniq_claim_many. Reversing puts the released
bodies of the earlier versions back.
"""

from django.db import migrations

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0010_producer_api_v2")]

    operations = [
        RunWithoutModels(
            run_file("claim_protocol_v3.sql"),
            run_file("claim_protocol_v3.down.sql", restore=(
                ("claim_protocol_v1.sql", "soniq_reap_lapsed_v1"),
                ("claim_protocol_v1.sql", "soniq_move_to_dead_letter_v1"),
                ("claim_protocol_v1.sql", "soniq_fail"),
                ("claim_protocol_v1.sql", "soniq_request_cancel"),
                ("claim_protocol_v1.sql", "soniq_claim"),
            )),
            elidable=False,
        ),
        RunWithoutModels(
            run_file("producer_api_v3.sql"),
            run_file("producer_api_v3.down.sql", restore=(
                ("producer_api_v2.sql", "soniq_enqueue"),
                ("producer_api_v2.sql", "soniq_enqueue_many"),
            )),
            elidable=False,
        ),
    ]
