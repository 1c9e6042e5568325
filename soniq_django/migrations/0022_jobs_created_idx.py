"""The admin at a million rows: soniq_jobs_created_idx, on soniq_jobs.created_at.

The jobs list shows the newest jobs first; without an index on created_at
each of its pages sorted the whole table (a sequential read, about 220 ms at
1,000,000 rows here), and so did its date drill-down and every search. The
index makes them read their page. Its cost: one more index entry for each
row version an enqueue, a claim or a completion writes (none of those
updates is HOT, as each changes an indexed column already); measured in
docs/performance.md, "The admin at a million rows". See
docs/decisions/0040-admin-at-a-million-rows.md.

A plain CREATE INDEX, which holds off writes to soniq_jobs while it runs
(about a second per million rows here). On a big, busy table build it
first with ``CREATE INDEX CONCURRENTLY soniq_jobs_created_idx ON soniq_jobs
(created_at)``, then record this migration with ``manage.py migrate
soniq_django 0022 --fake`` (after 0021 ran).
"""

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0021_job_trace'),
    ]

    operations = [
        migrations.AddIndex(
            model_name='job',
            index=models.Index(fields=['created_at'], name='soniq_jobs_created_idx'),
        ),
    ]
