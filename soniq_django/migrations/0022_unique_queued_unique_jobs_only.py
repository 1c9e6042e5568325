"""soniq_jobs_unique_queued holds the unique jobs only: ``status = 'queued' AND unique_job``.

Before, the partial unique index on ``(job_name, args_hash)`` took every
queued row, so each plain job (``args_hash`` NULL, which never conflicts)
wrote an index entry at its enqueue and again at every retry: about 80 bytes
of WAL per job and an index the size of the queue, for nothing. Soniq's own
index (``idx_soniq_jobs_unique_queued``) has had ``unique_job = TRUE`` in its
condition all along, and every ``ON CONFLICT`` that names the index (Soniq
0.1 and 0.2, ``soniq_enqueue`` since producer API v1) already says ``AND
unique_job = true``, so it infers the new index as it did the old one. What
it stops is unchanged: a second queued copy of a unique job. A row with an
``args_hash`` but ``unique_job`` false -- none of soniq_django's or Soniq's
writers makes one -- is no longer held to it, as under Soniq's index.

The index is replaced where it exists (a Soniq database adopted with a faked
0001 has only Soniq's own, and gets none), in one transaction: DROP INDEX then
CREATE UNIQUE INDEX, which holds off writes to soniq_jobs while it reads the
table (a second or so per million rows; it indexes only queued unique jobs).
Reversing puts the old condition back the same way. Why: decision 0036.
"""

from django.db import migrations, models

NAME = "soniq_jobs_unique_queued"
FIELDS = ("job_name", "args_hash")
OLD = models.UniqueConstraint(fields=FIELDS, condition=models.Q(status="queued"), name=NAME)
NEW = models.UniqueConstraint(
    fields=FIELDS, condition=models.Q(status="queued") & models.Q(unique_job=True), name=NAME)


def _replace(old: models.UniqueConstraint, new: models.UniqueConstraint):
    def run(apps, schema_editor):
        job = apps.get_model("soniq_django", "Job")
        with schema_editor.connection.cursor() as cursor:
            present = NAME in schema_editor.connection.introspection.get_constraints(
                cursor, job._meta.db_table)
        if present:
            schema_editor.remove_constraint(job, old)
            schema_editor.add_constraint(job, new)
    return run


class Migration(migrations.Migration):

    dependencies = [
        ('soniq_django', '0020_attempts'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunPython(_replace(OLD, NEW), _replace(NEW, OLD), elidable=False),
            ],
            state_operations=[
                migrations.RemoveConstraint(model_name='job', name=NAME),
                migrations.AddConstraint(model_name='job', constraint=NEW),
            ],
        ),
    ]
