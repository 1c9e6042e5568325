"""Django settings for django-tasks-db (the ORM backend of the Django Tasks backport).

Same database configuration as bench/soniq_settings.py (CONN_MAX_AGE 0, no
LOGGING); the default task backend is django_tasks_db.DatabaseBackend.
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
    "django_tasks",
    "django_tasks_db",
    "bench.peers.dtdb_app",
]
TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
