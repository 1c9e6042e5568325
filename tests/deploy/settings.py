"""Settings for the processes of the deployment tests (tests/deploy/).

tests.worker_settings (the database from ``SONIQ_WORKER_DATABASE_URL``, soniq
settings from ``SONIQ_<NAME>`` JSON variables), plus:

- ``SONIQ_TEST_LISTEN_DATABASE_URL``: a second alias, ``listen``, for
  ``SONIQ["LISTEN_DATABASE"]`` (a session-mode pool or the server itself);
- ``SONIQ_LISTEN_DATABASE`` and ``SONIQ_PREPARED_STATEMENTS`` as JSON;
- the chaos app, for its recording handler.

Nothing sets ``DISABLE_SERVER_SIDE_CURSORS``: the point is that the defaults
work behind a transaction pooler.
"""

import json
import os

import environ

from tests.worker_settings import *  # noqa: F403
from tests.worker_settings import DATABASES, INSTALLED_APPS, SONIQ

INSTALLED_APPS = [*INSTALLED_APPS, "tests.chaos"]

if "SONIQ_TEST_LISTEN_DATABASE_URL" in os.environ:
    DATABASES["listen"] = environ.Env.db_url_config(os.environ["SONIQ_TEST_LISTEN_DATABASE_URL"])

for _name in ("LISTEN_DATABASE", "PREPARED_STATEMENTS"):
    if f"SONIQ_{_name}" in os.environ:
        SONIQ[_name] = json.loads(os.environ[f"SONIQ_{_name}"])
