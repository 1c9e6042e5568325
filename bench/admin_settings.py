"""Django settings of ``python -m bench.admin``: the admin, in-process, on ``$BENCH_DB_NAME``.

The database is the benchmark's own (bench/common.py), with persistent
connections (CONN_MAX_AGE None), as a web process keeps them: the timings are
the pages', not a connection's set-up. No DEBUG: the query counts come from
a capture around one request of their own.
"""

import os

from bench.common import django_database

DATABASES = {"default": {**django_database(os.environ["BENCH_DB_NAME"]), "CONN_MAX_AGE": None}}
SECRET_KEY = "bench-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "soniq_django",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "bench.admin_urls"
STATIC_URL = "static/"
TEMPLATES = [{
    "BACKEND": "django.template.backends.django.DjangoTemplates",
    "APP_DIRS": True,
    "OPTIONS": {"context_processors": [
        "django.template.context_processors.request",
        "django.contrib.auth.context_processors.auth",
        "django.contrib.messages.context_processors.messages",
    ]},
}]
SONIQ: dict = {}
