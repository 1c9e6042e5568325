"""A project whose jobs live in a database of their own (tests/routers/).

``default`` holds the application (the example shop's orders, users,
sessions); ``jobs`` holds soniq_django's tables; ``jobs_replica`` is a
read-only connection to the jobs database, where the router sends reads;
``analytics`` is a SQLite database soniq never uses (in the PostgreSQL pass
too), configured as soniq would not accept for itself (no IMMEDIATE mode).
tests/routers/test_separate_jobs_database.py creates the databases (SQLite
files, or PostgreSQL databases of their own) and names them in
``SONIQ_ROUTERS_DEFAULT_URL``, ``SONIQ_ROUTERS_JOBS_URL`` and
``SONIQ_ROUTERS_ANALYTICS_PATH``; nothing here is a test database of
pytest-django's. ``SONIQ_ROUTERS_REQUIRE_SQL_API=1`` sets that setting.
"""

import os

import environ

from tests.settings import *  # noqa: F403

_SQLITE_OPTIONS = {"transaction_mode": "IMMEDIATE", "timeout": 20}


def _database(url: str) -> dict:
    config = environ.Env.db_url_config(url)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        config["OPTIONS"] = dict(_SQLITE_OPTIONS)
    return config


def _read_only(config: dict) -> dict:
    """The same database through a connection that cannot write."""
    replica = {**config, "OPTIONS": dict(config.get("OPTIONS", {}))}
    if config["ENGINE"] == "django.db.backends.sqlite3":
        replica["NAME"] = f"file:{config['NAME']}?mode=ro"
        replica["OPTIONS"] = {"timeout": 20}  # no IMMEDIATE: BEGIN IMMEDIATE is a write
    else:
        replica["OPTIONS"]["options"] = "-c default_transaction_read_only=on"
    return replica


DATABASES = {
    "default": _database(os.environ["SONIQ_ROUTERS_DEFAULT_URL"]),
    "jobs": _database(os.environ["SONIQ_ROUTERS_JOBS_URL"]),
}
DATABASES["jobs_replica"] = _read_only(DATABASES["jobs"])
DATABASES["analytics"] = {"ENGINE": "django.db.backends.sqlite3",
                          "NAME": os.environ["SONIQ_ROUTERS_ANALYTICS_PATH"]}
DATABASE_ROUTERS = ["tests.routers.router.JobsRouter"]

SONIQ = {"REQUIRE_SQL_API": os.environ.get("SONIQ_ROUTERS_REQUIRE_SQL_API") == "1"}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"soniq_django": {"handlers": ["stderr"], "level": "INFO"}},
}
