"""Off and free: no span, no provider or no OpenTelemetry at all costs no statement and no import.

The enqueue fast path is benchmarked (decisions 0027 and 0028): without a
sampled span current, an enqueue sends exactly what it sent before tracing
existed; without a tracer provider the worker reads nothing more; and a
process that never imported OpenTelemetry never imports it through soniq.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from opentelemetry import trace

from soniq_django import bulk_enqueue, enqueue
from soniq_django.models import JobTrace
from soniq_django.producer.request import JobRequest
from soniq_django.testing import run_jobs
from tests.tracing import handlers  # noqa: F401  (registers the jobs run here)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.django_db


def _statements(call) -> list[str]:
    with CaptureQueriesContext(connection) as captured:
        call()
    return [query["sql"] for query in captured.captured_queries]


def _about_traces(statements: list[str]) -> list[str]:
    return [sql for sql in statements if "soniq_job_trace" in sql]


def test_without_a_span_an_enqueue_sends_what_it_always_sent(spans):
    plain = _statements(lambda: enqueue("tracing.ok", {"n": 1}))
    bulk = _statements(lambda: bulk_enqueue([JobRequest("tracing.ok", {"n": n})
                                             for n in range(3)]))
    assert not _about_traces(plain) and not _about_traces(bulk)
    assert not JobTrace.objects.exists()
    assert not spans.all()  # no producer span either
    with spans.tracer.start_as_current_span("request"):
        traced = _statements(lambda: enqueue("tracing.ok", {"n": 2}))
    assert len(_about_traces(traced)) == 1
    if connection.vendor == "postgresql":  # one statement, traced or not
        assert len(traced) == len(plain)


def test_without_a_provider_the_worker_reads_no_trace_and_makes_no_span():
    # A context handed over by an incoming request (no provider here): carried...
    remote = trace.NonRecordingSpan(trace.SpanContext(
        trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=trace.TraceFlags(1)))
    with trace.use_span(remote):
        job_id = enqueue("tracing.ok")
    assert JobTrace.objects.get(job_id=job_id).traceparent == (
        f"00-{0xABC:032x}-{0xDEF:016x}-01")
    # ...but a worker without a provider neither reads it nor makes a span.
    ran = []
    statements = _statements(lambda: ran.extend(run_jobs()))
    assert [run.outcome for run in ran] == ["done"]
    assert not _about_traces(statements)


def test_with_a_provider_the_worker_reads_the_contexts_once_per_claim(spans):
    ids = {enqueue("tracing.ok", {"n": n}) for n in range(2)}
    statements = _statements(lambda: run_jobs())
    assert len(_about_traces(statements)) == 2  # run_jobs claims one job at a time
    processes = spans.named("soniq process tracing.ok")
    assert {span.attributes["messaging.message.id"] for span in processes} == set(map(str, ids))
    assert all(span.links == () for span in processes)  # enqueued under no span


PROBE = """
import sys

import django

django.setup()
from django.core.management import call_command

from soniq_django import enqueue
from soniq_django.testing import run_jobs

call_command("migrate", verbosity=0)
enqueue("lean.add", {"a": 2, "b": 3})
(run,) = run_jobs()
assert run.outcome == "done", run
print(sorted(name for name in sys.modules if name.split(".")[0] == "opentelemetry"))
"""

SETTINGS = """
DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": %(db)r}}
SECRET_KEY = "not-secret"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "soniq_django"]
SONIQ = {"IMPORTS": ["lean_jobs"]}
"""

JOBS = """
from soniq_django import job


@job(name="lean.add")
def add(a: int, b: int) -> int:
    return a + b
"""


@pytest.mark.sqlite_only  # a process of its own, with its own SQLite database
def test_a_process_that_never_imported_opentelemetry_never_imports_it_through_soniq(tmp_path):
    (tmp_path / "lean_settings.py").write_text(
        textwrap.dedent(SETTINGS % {"db": str(tmp_path / "lean.sqlite3")}), encoding="utf-8")
    (tmp_path / "lean_jobs.py").write_text(textwrap.dedent(JOBS), encoding="utf-8")
    (tmp_path / "probe.py").write_text(textwrap.dedent(PROBE), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if not key.startswith("SONIQ_")}
    env.update(DJANGO_SETTINGS_MODULE="lean_settings",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(tmp_path)]))
    done = subprocess.run([sys.executable, str(tmp_path / "probe.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
