"""A SQLite project needs none of the extras: no psycopg, no django-environ, no backport,
no prometheus_client, no OpenTelemetry.

``pip install soniq-django`` brings Django and croniter only (docs/install.md).
The subprocess below makes ``import psycopg`` (and psycopg2, django-environ,
the django-tasks backport, prometheus_client and opentelemetry) fail, as in a
virtualenv without them, then imports every module of the package (soniq_django.metrics refuses with
ExtraNotInstalled, an ImportError naming its extra), migrates a SQLite database, enqueues a
job and runs it with ``soniq_worker --burst``.

SQLite only: psycopg is optional for SQLite projects alone (Django's
PostgreSQL backend needs it), and the subprocess has its own SQLite
database whatever the pass, so the PostgreSQL pass would repeat the same run.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.sqlite_only

#: Modules that may need an optional package: the PostgreSQL producer calls
#: and its COPY path (psycopg), the Tasks backend without ``django.tasks`` (Django < 6), and the
#: Prometheus metrics (prometheus_client, the ``prometheus`` extra).
OPTIONAL = {"soniq_django.producer._pg": "psycopg", "soniq_django.producer._copy": "psycopg",
            "soniq_django.tasks_backend": "django_tasks",
            "soniq_django.metrics": "prometheus_client"}

SETTINGS = """
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": %(db)r}}
SECRET_KEY = "not-secret"
USE_TZ = True
INSTALLED_APPS = [
    "django.contrib.admin", "django.contrib.auth", "django.contrib.contenttypes",
    "django.contrib.sessions", "django.contrib.messages", "soniq_django",
]
SONIQ = {"IMPORTS": ["lean_jobs"]}
"""

JOBS = """
from soniq_django import job


@job(name="lean.add")
def add(a: int, b: int) -> int:
    return a + b
"""

RUN = """
import sys

BLOCKED = ("psycopg", "psycopg2", "psycopg_binary", "psycopg_c", "environ", "django_tasks",
           "prometheus_client", "opentelemetry")
for name in BLOCKED:
    sys.modules[name] = None  # import fails: "import of psycopg halted"

import importlib
import pkgutil

import django

django.setup()

from django.core.management import call_command

import soniq_django
from soniq_django import enqueue, get_job

optional = %(optional)r
try:
    import django.tasks  # noqa: F401  (Django 6 has it built in)
    del optional["soniq_django.tasks_backend"]
except ImportError:
    pass
for module in pkgutil.walk_packages(soniq_django.__path__, "soniq_django."):
    if module.name in optional:
        try:
            importlib.import_module(module.name)
        except ImportError as error:
            assert optional[module.name] in str(error), error
        else:
            raise AssertionError(module.name + " imported without " + optional[module.name])
    else:
        importlib.import_module(module.name)

from django.core.management.base import CommandError

from soniq_django.errors import ErrorCode, ExtraNotInstalled

try:
    import soniq_django.metrics  # noqa: F401
except ExtraNotInstalled as error:
    assert error.code is ErrorCode.EXTRA_NOT_INSTALLED, error
    assert "pip install soniq-django[prometheus]" in str(error), error
else:
    raise AssertionError("soniq_django.metrics imported without prometheus_client")

call_command("migrate", verbosity=0)
try:
    call_command("soniq_worker", burst=True, metrics_port=0, verbosity=0)
except CommandError as error:
    assert "pip install soniq-django[prometheus]" in str(error), error
else:
    raise AssertionError("soniq_worker --metrics-port ran without prometheus_client")
job_id = enqueue("lean.add", {"a": 2, "b": 3})
call_command("soniq_worker", burst=True, verbosity=0)
info = get_job(job_id)
assert (info.status, info.result) == ("done", 5), info
assert not [name for name in BLOCKED if sys.modules.get(name) is not None]
print("ran", info.status, info.result)
"""


def test_a_sqlite_project_imports_enqueues_and_runs_jobs_without_the_extras(tmp_path):
    (tmp_path / "lean_settings.py").write_text(
        textwrap.dedent(SETTINGS % {"db": str(tmp_path / "lean.sqlite3")}), encoding="utf-8")
    (tmp_path / "lean_jobs.py").write_text(textwrap.dedent(JOBS), encoding="utf-8")
    (tmp_path / "run.py").write_text(textwrap.dedent(RUN % {"optional": OPTIONAL}),
                                     encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SONIQ_")}
    env.update(DJANGO_SETTINGS_MODULE="lean_settings",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    done = subprocess.run([sys.executable, str(tmp_path / "run.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "ran done 5", done.stdout
