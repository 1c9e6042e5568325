"""WAL per job: soniq_jobs_created_idx without the processing row versions.

The admin's index on created_at (migration 0022, decision 0040) had an entry
for each row version, and no update of a job row is HOT: the enqueue's
queued version, the claim's processing one and the completion's finished
one each wrote a 64-byte index record to the WAL. The processing version's
entry is the one nobody needs: the running jobs are few (at most the
workers' slots), and the admin reads them on their own and merges them into
its newest-first list, its counts, its date drill-down's ends and its search
window (admin/scale.py, ``Apart``). Measured: about 60-90 B of WAL a job
less (docs/performance.md, "WAL per job"; decision 0051).

Not part of the storage format (docs/storage-format.md): a table with the
full index, or without it, is as valid. Soniq's writers keep it up to date
like any index. Reversing restores the full index.

A plain DROP INDEX and CREATE INDEX, which hold off writes to soniq_jobs
while the index is built (about a second per million rows here). On a big,
busy table build the new one first under another name with ``CREATE INDEX
CONCURRENTLY soniq_jobs_created_idx_new ON soniq_jobs (created_at) WHERE NOT
(status = 'processing')``, then ``DROP INDEX CONCURRENTLY
soniq_jobs_created_idx``, ``ALTER INDEX soniq_jobs_created_idx_new RENAME TO
soniq_jobs_created_idx``, and record this migration with ``manage.py migrate
soniq_django 0033 --fake``.
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0030_worker_registry'),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name='job',
            name='soniq_jobs_created_idx',
        ),
        migrations.AddIndex(
            model_name='job',
            index=models.Index(condition=models.Q(('status', 'processing'), _negated=True),
                               fields=['created_at'], name='soniq_jobs_created_idx'),
        ),
    ]
