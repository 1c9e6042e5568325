"""Where a database made by Soniq 0.1.0 keeps soniq_django's writes out, let them in (PostgreSQL).

Soniq's own migrations declare two columns NOT NULL that format 1 leaves
NULLable, and soniq_django writes NULL there: ``max_attempts`` of a dead
letter (a job enqueued with ``max_attempts=None`` that ran out of its
handler's retries) and of a recurring job (``@periodic(max_attempts=None)``),
and ``original_created_at`` of a dead letter. On such a database moving that
job to the dead letters failed, again after every lapsed lease. Dropping the
NOT NULL changes nothing for Soniq's own writers, which always give a value.

Soniq has no index for the order soniq_claim takes jobs in (priority, then
age, among queued rows); soniq_django's two claim indexes, which 0001 made on
its own databases and which a faked 0001 did not, are created when missing.

On soniq_django's own databases every step finds its work done. The reverse
changes nothing: these relaxations and indexes are harmless to both sides.
"""

from django.db import migrations
from soniq_django.schema.operations import RunWithoutModels

STEPS = """
ALTER TABLE soniq_dead_letter_jobs ALTER COLUMN max_attempts DROP NOT NULL;
ALTER TABLE soniq_dead_letter_jobs ALTER COLUMN original_created_at DROP NOT NULL;
ALTER TABLE soniq_recurring_jobs ALTER COLUMN max_attempts DROP NOT NULL;
CREATE INDEX IF NOT EXISTS soniq_jobs_claim_idx
    ON soniq_jobs (queue, priority, created_at) WHERE status = 'queued';
CREATE INDEX IF NOT EXISTS soniq_jobs_claim_any_idx
    ON soniq_jobs (priority, created_at) WHERE status = 'queued';
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(STEPS)


class Migration(migrations.Migration):
    dependencies = [("soniq_django", "0007_protect_owned_v2")]

    operations = [
        RunWithoutModels(forward, migrations.RunPython.noop, elidable=False),
    ]
