"""A bad SONIQ setting never breaks an import; the checks report it and its first use names it.

``@job``, ``@periodic`` and a Tasks ``@task`` leave the settings alone when
they decorate (apps.ready() imports every jobs module before ``manage.py
check`` could say anything), and a call that needs a value the checks
reject raises ``SettingsInvalid`` naming the key, its value's type and the
check id.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import override_settings

from soniq_django import enqueue, job, periodic, periodic_jobs, registry
from soniq_django.errors import ErrorCode, SettingsInvalid
from soniq_django.producer.request import JobRequest, prepare

ROOT = Path(__file__).resolve().parent.parent

#: A bad value, the check that reports it and the type its error names.
BAD = {
    "priority not a number": ({"DEFAULT_PRIORITY": "high"}, "soniq.E003", "str"),
    "pattern not a regex": ({"TASK_NAME_PATTERN": "([a-z"}, "soniq.E004", "str"),
    "pattern not text": ({"TASK_NAME_PATTERN": 5}, "soniq.E004", "int"),
    "empty default queue": ({"DEFAULT_QUEUE": ""}, "soniq.E003", "str"),
    "no attempts": ({"DEFAULT_MAX_ATTEMPTS": 0}, "soniq.E003", "int"),
    "payload limit as text": ({"MAX_PAYLOAD_BYTES": "1MB"}, "soniq.E003", "str"),
}


@pytest.fixture(autouse=True)
def private_registries(monkeypatch):
    # Handlers and schedules made here must not leak into other tests.
    monkeypatch.setattr(periodic_jobs, "_schedules", {})
    monkeypatch.setattr(registry, "_registry", dict(registry._registry))


def declare():
    """What a jobs module does at import: a @job handler with a @periodic schedule."""

    @periodic(every=60, args={"n": 1})
    @job(name="edges.tick")
    def tick(n: int = 0):
        return n

    return tick


@pytest.mark.parametrize("case", list(BAD))
def test_declaring_a_periodic_handler_does_not_raise(case):
    config, _, _ = BAD[case]
    with override_settings(SONIQ=config):
        tick = declare()
    assert periodic_jobs.code_schedules()["edges.tick"].handler is tick


@pytest.mark.parametrize("case", list(BAD))
def test_enqueueing_it_names_the_setting_its_type_and_the_check(case):
    config, check_id, type_name = BAD[case]
    (key,) = config
    with override_settings(SONIQ=config):
        tick = declare()
        with pytest.raises(SettingsInvalid) as raised:
            tick.enqueue(n=2)
    error = raised.value
    assert isinstance(error, ImproperlyConfigured)
    assert error.code is ErrorCode.SETTINGS_INVALID
    assert (error.key, error.check_id) == (key, check_id)
    assert error.reason.startswith(f"SONIQ[{key!r}] ")
    assert error.reason.endswith(f" (got a value of type {type_name}); manage.py check reports "
                                 f"it as {check_id}")
    if isinstance(config[key], str) and config[key]:
        assert config[key] not in error.reason  # the type, never the value


@pytest.mark.parametrize("case", ["priority not a number", "empty default queue"])
def test_the_scheduler_meets_the_setting_when_it_writes_the_schedule(case):
    config, check_id, _ = BAD[case]
    with override_settings(SONIQ=config):
        declare()
        with pytest.raises(SettingsInvalid) as raised:
            periodic_jobs.code_schedules()["edges.tick"].row_values()
    assert raised.value.check_id == check_id


def test_a_schedule_is_still_checked_at_import_once_the_settings_are_right():
    with pytest.raises(ImproperlyConfigured, match="priority must be a whole number"):
        periodic(every=60, priority="high")(job(name="edges.strict")(lambda: None))


def test_a_call_that_does_not_use_the_bad_default_is_not_refused():
    with override_settings(SONIQ={"DEFAULT_QUEUE": "", "DEFAULT_PRIORITY": "high"}):
        prepared = prepare(JobRequest("edges.tick", {}, queue="mail", priority=5))
        with pytest.raises(SettingsInvalid) as raised:
            enqueue("edges.tick", {}, queue="mail")
    assert (prepared.queue, prepared.priority) == ("mail", 5)
    assert raised.value.key == "DEFAULT_PRIORITY"


def test_a_task_with_a_bad_pattern_is_defined_and_refused_at_enqueue():
    try:  # Django 6
        from django.tasks import task
    except ImportError:  # the django-tasks backport
        from django_tasks import task

    def noop():
        return None

    noop.__module__, noop.__qualname__ = "tests.test_bad_settings", "noop"  # as if module-level
    with override_settings(SONIQ={"TASK_NAME_PATTERN": "([a-z"}):
        defined = task()(noop)
        with pytest.raises(SettingsInvalid) as raised:
            defined.enqueue()
    assert raised.value.check_id == "soniq.E004"


# -- manage.py check, in a process of its own ---------------------------------


@pytest.mark.parametrize("case", ["priority not a number", "pattern not a regex"])
def test_manage_py_check_reports_the_setting_without_a_traceback(case, tmp_path):
    config, check_id, _ = BAD[case]
    # An installed app whose jobs module holds a @periodic handler, as
    # apps.ready() imports it before any check runs.
    app = tmp_path / "edgesapp"
    app.mkdir()
    (app / "__init__.py").write_text("")
    (app / "jobs.py").write_text(textwrap.dedent('''
        from soniq_django import job, periodic


        @periodic(every=60)
        @job(name="edges.tick")
        def tick():
            return 1
    '''))
    (tmp_path / "edges_settings.py").write_text(textwrap.dedent(f'''
        from tests.settings import *  # noqa: F403
        from tests.settings import INSTALLED_APPS

        INSTALLED_APPS = [*INSTALLED_APPS, "edgesapp"]
        SONIQ = {config!r}
    '''))
    done = subprocess.run(
        [sys.executable, "manage.py", "check"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, env={**os.environ, "DJANGO_SETTINGS_MODULE": "edges_settings",
                          "PYTHONPATH": f"{ROOT}:{tmp_path}"})
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert f"({check_id}) SONIQ[{next(iter(config))!r}]" in output
    assert "Traceback" not in output

