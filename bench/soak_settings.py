"""Django settings of the soak run's workers (bench/soak.py).

The benchmark's settings (bench/soniq_settings.py: every SONIQ default, the
database ``$BENCH_DB_NAME`` on ``$BENCH_DATABASE_URL``), with two changes:
finished rows are kept ``$SOAK_RESULT_TTL`` seconds (120 unless the run says
otherwise) instead of 300, so that the workers' purge runs many cycles in a
30-minute run; and the soak's job module is imported.
"""

import os

from bench.soniq_settings import *  # noqa: F403

SONIQ = {
    "RESULT_TTL": float(os.environ.get("SOAK_RESULT_TTL", "120")),
    "IMPORTS": ["bench.soak_jobs"],
}
