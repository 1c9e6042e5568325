"""The one table the benchmark's writing jobs write to (the atomic-vs-plain rows)."""
from django.db import models


class Effect(models.Model):
    """One row per job run that wrote; ``i`` is the job's argument (unique per queued job)."""

    i = models.IntegerField()

    class Meta:
        db_table = "bench_effects"
