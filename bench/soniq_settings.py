"""Django settings of the soniq_django benchmark processes.

The database is ``$BENCH_DB_NAME`` on the benchmark server (bench/common.py),
configured as django-environ configures ``DATABASE_URL`` in the example
project: CONN_MAX_AGE 0 unless BENCH_CONN_MAX_AGE says otherwise. No LOGGING;
the workers run with ``--verbosity 0``, so no per-job INFO line is printed, as for
the peers.
"""

import os

from bench.common import django_database

DATABASES = {"default": django_database(os.environ["BENCH_DB_NAME"])}
SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "soniq_django",
    "bench.soniq_app",
]
SONIQ = {}  # every default: lease 30 s, heartbeat 10 s, poll 5 s
