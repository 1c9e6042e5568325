"""Settings for worker processes started by the tests (tests/worker/test_worker_processes.py).

The parent test passes the database the child must use -- pytest-django's
test database, not the one ``tests.settings`` would name -- as
``SONIQ_WORKER_DATABASE_URL``, and soniq settings as ``SONIQ_<NAME>``
variables holding JSON values (``SONIQ_LEASE_SECONDS=1``).
``SONIQ_TEST_LOGGING``, when set, is the JSON of the ``LOGGING`` setting
instead of the one below: ``{}`` is a project that configures no logging
(Django's default), as a fresh ``startproject`` is.
"""

import json
import os

import environ

from tests.settings import *  # noqa: F403
from tests.settings import SONIQ as _BASE_SONIQ

DATABASES = {"default": environ.Env.db_url_config(os.environ["SONIQ_WORKER_DATABASE_URL"])}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The locking of tests.settings (and of the example project). Durability
    # is off, as on run-tests' throwaway PostgreSQL cluster: each commit's
    # fsync (~8 ms here) would otherwise dominate the 2,000-job test. Locking
    # and visibility between processes are unchanged.
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE", "timeout": 20,
        "init_command": "PRAGMA synchronous = OFF",
    }

if "SONIQ_TEST_APPLICATION_NAME" in os.environ:  # every connection of the process says whose
    DATABASES["default"]["OPTIONS"] = {**DATABASES["default"].get("OPTIONS", {}),
                                       "application_name": os.environ["SONIQ_TEST_APPLICATION_NAME"]}

if "SONIQ_TEST_CONN_MAX_AGE" in os.environ:  # JSON: a number of seconds, or null (forever)
    DATABASES["default"]["CONN_MAX_AGE"] = json.loads(os.environ["SONIQ_TEST_CONN_MAX_AGE"])

_NAMES = (
    "LEASE_SECONDS", "HEARTBEAT_SECONDS", "POLL_INTERVAL", "RESULT_TTL",
    "RETRY_BASE_SECONDS", "RETRY_MAX_SECONDS", "JOB_TIMEOUT_SECONDS", "DEFAULT_MAX_ATTEMPTS",
    "IMPORTS", "UNKNOWN_JOB_GRACE_SECONDS", "QUEUES", "METRICS_CACHE_SECONDS",
)
SONIQ = dict(_BASE_SONIQ)
SONIQ.update(
    {name: json.loads(os.environ[f"SONIQ_{name}"]) for name in _NAMES
     if f"SONIQ_{name}" in os.environ}
)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(process)d %(threadName)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {"soniq_django": {"handlers": ["stderr"], "level": "INFO"}},
}
if "SONIQ_TEST_LOGGING" in os.environ:
    LOGGING = json.loads(os.environ["SONIQ_TEST_LOGGING"])
