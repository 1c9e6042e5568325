"""Settings for the test suite.

The suite runs once per database backend. ``SONIQ_TEST_BACKEND`` picks it
(``sqlite`` or ``postgresql``); for PostgreSQL ``SONIQ_TEST_DATABASE_URL``
names the server (``scripts/run-tests`` resolves it before starting pytest).

The PostgreSQL test database is ``SONIQ_TEST_DATABASE_NAME``, or else a name
of this run's own (``test_soniq_django_<pid>_<random>``), so that two runs
on one server never create, flush or drop each other's database. The name
chosen is put into the environment, so every process this run starts with
these settings (``tests.settings`` or a module built on it) uses the same
one. ``scripts/run-tests`` chooses it once per run and drops what a killed
run left behind.
"""

import os
import secrets
import tempfile
from importlib.util import find_spec

import environ

BACKEND = os.environ.get("SONIQ_TEST_BACKEND", "sqlite")
#: The prefix of every test database name this suite chooses for itself.
TEST_DATABASE_PREFIX = "test_soniq_django_"


def run_database_name() -> str:
    """This run's test database name: ``SONIQ_TEST_DATABASE_NAME``, else a new unique one.

    A new name goes into ``os.environ``, where the processes this one
    starts find it.
    """
    name = os.environ.get("SONIQ_TEST_DATABASE_NAME")
    if not name:
        name = f"{TEST_DATABASE_PREFIX}{os.getpid()}_{secrets.token_hex(3)}"
        os.environ["SONIQ_TEST_DATABASE_NAME"] = name
    return name


if BACKEND == "postgresql":
    _url = os.environ.get(
        "SONIQ_TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres"
    )
    _db = environ.Env.db_url_config(_url)
    _db["TEST"] = {"NAME": run_database_name()}
elif BACKEND == "sqlite":
    # A file, not ``:memory:``: later tests start worker processes that must
    # see the same database.
    _dir = os.environ.get("SONIQ_TEST_SQLITE_DIR") or tempfile.gettempdir()
    _db = {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": os.path.join(_dir, f"soniq_dev_{os.getpid()}.sqlite3"),
        "TEST": {"NAME": os.path.join(_dir, f"soniq_test_{os.getpid()}.sqlite3")},
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "timeout": 20},
    }
else:  # pragma: no cover - a typo in the environment
    raise RuntimeError(f"SONIQ_TEST_BACKEND must be sqlite or postgresql, not {BACKEND!r}")

DATABASES = {"default": _db}
if BACKEND == "postgresql":
    # The test database again, through a connection that binds parameters on
    # the server (Django's documented OPTIONS["server_side_binding"]); a
    # mirror, so it is neither created nor flushed on its own.
    DATABASES["server_binding"] = {
        **_db, "OPTIONS": {**_db.get("OPTIONS", {}), "server_side_binding": True},
        "TEST": {"MIRROR": "default"},
    }

SECRET_KEY = "tests-only-not-secret"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ALLOWED_HOSTS = ["testserver", "localhost"]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "soniq_django",
    "example_project.shop",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]

ROOT_URLCONF = "example_project.urls"
STATIC_URL = "static/"
# Tests log users in often; a fast hasher keeps that cheap.
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

SONIQ = {}

# Django tasks (tests/testapp/tasks.py) run as soniq jobs. "immediate" is a
# backend of another kind: the worker must refuse to run its tasks. Its path
# is Django 6's own django.tasks where that exists (as soniq_django's backend
# prefers it), else the django-tasks backport's. "atomic" is a soniq backend
# whose tasks run atomically.
_tasks_package = "django.tasks" if find_spec("django.tasks") else "django_tasks"
TASKS = {
    "default": {
        "BACKEND": "soniq_django.tasks_backend.SoniqTaskBackend",
        "QUEUES": ["default", "tasks"],
    },
    "immediate": {"BACKEND": f"{_tasks_package}.backends.immediate.ImmediateBackend"},
    # Its tasks run atomically (tests/test_tasks_backend.py).
    "atomic": {
        "BACKEND": "soniq_django.tasks_backend.SoniqTaskBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"atomic": True},
    },
    # A 1 s limit for each of its tasks (tests/worker/test_timeouts.py).
    "timeouts": {
        "BACKEND": "soniq_django.tasks_backend.SoniqTaskBackend",
        "QUEUES": ["default"],
        "OPTIONS": {"timeout": 1, "max_attempts": 1},
    },
}
