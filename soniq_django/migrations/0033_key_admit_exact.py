"""A key offers exactly its most urgent due job (decision 0052).

Adds soniq_key_parked_rank_idx on (queue, key, priority, coalesce(run_at,
created_at)): a key's jobs by priority, then by how long each has been due.
Then sql/key_order_v1.sql gives soniq_key_admit_v1 a new body (PostgreSQL;
same signature and callers) and sql/sqlite/key_order_v1.sql replaces the
trigger soniq_key_admit (SQLite): both pick the head in that order. Last, the
two indexes version 12's pick read and nothing reads now are dropped
(soniq_key_parked_order_idx, soniq_key_parked_now_idx). Reversing puts the
indexes back, then version 12's body and trigger from the files that
released them, then drops the new index. See docs/keys.md.
"""

import django.db.models.functions.comparison
from django.db import migrations, models

from soniq_django.schema.operations import RunWithoutModels
from soniq_django.sql import run_file, run_sqlite_file


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0032_key_park'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='keyparked',
            index=models.Index(models.F('queue'), models.F('key'), models.F('priority'),
                               django.db.models.functions.comparison.Coalesce(
                                   'run_at', 'created_at'),
                               name='soniq_key_parked_rank_idx'),
        ),
        RunWithoutModels(
            run_file("key_order_v1.sql"),
            run_file("key_order_v1.down.sql", restore=(
                ("claim_protocol_v12.sql", "soniq_key_admit_v1"),
            )),
            elidable=False,
        ),
        RunWithoutModels(
            run_sqlite_file("key_order_v1.sql"),
            run_sqlite_file("key_order_v1.down.sql", restore=(
                ("claim_protocol_v12.sql", "soniq_key_admit"),
            )),
            elidable=False,
        ),
        migrations.RemoveIndex(
            model_name='keyparked',
            name='soniq_key_parked_order_idx',
        ),
        migrations.RemoveIndex(
            model_name='keyparked',
            name='soniq_key_parked_now_idx',
        ),
    ]
