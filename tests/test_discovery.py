"""Handler discovery beyond ``<app>/jobs.py``: the modules ``SONIQ["IMPORTS"]`` names.

Each test writes a module of its own, under a fresh name, into a directory
on ``sys.path`` that is no installed app: nothing else imports it, so the
test sees exactly what discovery imports.
"""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from soniq_django import enqueue
from soniq_django.models import Job
from soniq_django.registry import discover, get_handler
from soniq_django.worker import Worker
from tests.support.workers import WorkerThread

ROOT = Path(__file__).resolve().parents[1]

HANDLERS = '''
from soniq_django import job

@job(name="{job_name}")
def shout(word):
    return word.upper()
'''

TASKS = '''
try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

@task()
def shout(word):
    return word.upper()
'''


@pytest.fixture
def modules(tmp_path, monkeypatch):
    """Write a module outside every installed app; return its (unique) name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(text: str) -> str:
        name = f"handlers_{secrets.token_hex(4)}"
        (tmp_path / f"{name}.py").write_text(text)
        return name

    return write


def test_a_module_named_by_imports_is_imported_and_its_handlers_found(settings, modules):
    job_name = f"rolling.shout_{secrets.token_hex(4)}"
    module = modules(HANDLERS.format(job_name=job_name))
    assert get_handler(job_name) is None
    settings.SONIQ = {"IMPORTS": [module]}
    assert discover() == []
    assert module in sys.modules
    assert get_handler(job_name)("hi") == "HI"
    assert discover() == []  # again: nothing new, nothing fails


def test_modules_that_cannot_be_imported_are_reported_by_name_never_raised(settings, modules):
    broken = modules("raise RuntimeError('a message that stays out of reports')\n")
    settings.SONIQ = {"IMPORTS": ["tests.no_such_module", broken]}
    assert discover() == [("tests.no_such_module", "ModuleNotFoundError"),
                          (broken, "RuntimeError")]


@pytest.mark.parametrize("imports", ["shop.tasks", [1], None])
def test_imports_that_is_not_a_list_of_names_imports_nothing(settings, imports):
    settings.SONIQ = {"IMPORTS": imports}
    assert discover() == []  # soniq.E003 reports it (tests/test_checks.py)


@pytest.mark.django_db(transaction=True)
def test_a_django_task_outside_installed_apps_runs_once_imports_names_its_module(
        settings, modules):
    module = modules(TASKS)
    job_name = f"{module}.shout"
    assert get_handler(job_name) is None  # not loaded, not in an installed app
    settings.SONIQ = {"IMPORTS": [module], "POLL_INTERVAL": 0.2}
    assert discover() == []
    job_id = enqueue(job_name, {"args": ["hi"], "kwargs": {}})
    assert WorkerThread(Worker(burst=True)).start().join() == 0
    row = Job.objects.get(id=job_id)
    assert (row.status, row.result) == ("done", "HI")


@pytest.mark.django_db
def test_the_worker_command_refuses_to_start_while_a_module_cannot_be_imported(settings):
    settings.SONIQ = {"IMPORTS": ["tests.no_such_module"]}
    with pytest.raises(CommandError) as caught:
        call_command("soniq_worker", "--burst")
    assert str(caught.value) == ("SONIQ['IMPORTS'] names modules that cannot be imported: "
                                 "tests.no_such_module (ModuleNotFoundError)")


def test_django_starts_with_a_broken_module_and_manage_py_check_names_it(tmp_path, modules):
    broken = modules("raise RuntimeError('a message that stays out of reports')\n")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.worker_settings",
           "SONIQ_WORKER_DATABASE_URL": f"sqlite:///{tmp_path / 'unused.sqlite3'}",
           "SONIQ_IMPORTS": f'["{broken}", "tests.no_such_module"]',
           "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    done = subprocess.run([sys.executable, "manage.py", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert f"soniq.E009) SONIQ['IMPORTS'] names the module '{broken}', which cannot be " \
           "imported (RuntimeError)." in done.stderr
    assert "'tests.no_such_module', which cannot be imported (ModuleNotFoundError)" in (
        done.stderr)
    assert "Traceback" not in done.stderr and "stays out of reports" not in done.stderr


def test_a_job_in_an_installed_apps_tasks_module_is_found_when_django_starts():
    # A fresh process: django.setup() alone, nothing else imports tests/testapp/tasks.py.
    code = ("import django; django.setup(); "
            "from soniq_django.registry import get_handler; "
            "print(get_handler('tests.testapp.tasks.job_in_tasks_py') is not None)")
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "True"
