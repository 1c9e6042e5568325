"""Tables of the test handlers (created for the test database; the app has no migrations)."""

from django.db import models


class Effect(models.Model):
    """One row per write of an atomic test handler (tests/worker/test_atomic.py).

    No unique constraint: a run whose writes landed twice would show as two
    rows. ``generation`` is the run's claim generation (``current_job()``),
    so a row names the run that wrote it.
    """

    job_id = models.UUIDField()
    generation = models.BigIntegerField()
    attempt = models.IntegerField()
    pid = models.IntegerField()
    note = models.TextField(default="")

    class Meta:
        app_label = "testapp"
