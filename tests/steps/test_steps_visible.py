"""Steps seen from outside: get_job().steps, the admin's job and dead-letter pages, the signals."""

import pytest
from django.db import connection
from django.urls import reverse
from django.test.utils import CaptureQueriesContext

from soniq_django import enqueue, get_job, signals
from soniq_django.admin.steps import STEPS_SHOWN, render_steps
from soniq_django.models import DeadLetterJob
from soniq_django.owned import OwnedJobSource
from soniq_django.worker.context import _current
from tests.steps.test_steps import lapse, run_of

pytestmark = [pytest.mark.django_db(transaction=True)]

HOSTILE = "<script>alert(1)</script>"
SECRET = "card-4242-secret"


@pytest.fixture(autouse=True)
def unbound():
    yield
    _current.set(None)


def section(page: str) -> str:
    start = page.index("field-steps_shown")
    return page[start:page.index("</fieldset>", start)]


def test_get_job_lists_the_recorded_steps_in_order():
    source = OwnedJobSource("default")
    job_id = enqueue("tests.steps.three", {})
    assert get_job(job_id).steps == ()
    run = run_of(source)
    for name in ("fetch", "charge", "email"):
        run.step(name, lambda: None)
    assert get_job(job_id).steps == ("fetch", "charge", "email")


def test_the_admin_lists_steps_with_attempt_and_size_never_results(admin_client):
    source = OwnedJobSource("default")
    job_id = enqueue("tests.steps.three", {})
    first = run_of(source)
    first.step("charge", lambda: {"token": SECRET})
    lapse(job_id)
    second = run_of(source)
    second.step(HOSTILE, lambda: [1, 2, 3], atomic=True)
    page = section(admin_client.get(
        reverse("admin:soniq_django_job_change", args=[job_id])).content.decode())
    assert "<th>step</th><th>recorded</th><th>by attempt</th><th>size</th>" in page
    assert "<td>charge</td>" in page and SECRET not in page
    assert HOSTILE not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    rows = page.split("<tr>")[2:]
    assert "<td>1</td>" in rows[0] and "<td>2</td>" in rows[1]  # by attempt
    # The sizes of {"token": "card-4242-secret"} and [1, 2, 3] as JSON text.
    assert "<td>29 B</td>" in rows[0] and "<td>9 B</td>" in rows[1]
    # A dead letter's page shows them too: they stay while the job is in either table.
    assert source.fail_owned(second._fence, "no", retry=False) is True
    assert DeadLetterJob.objects.filter(id=job_id).exists()
    page = section(admin_client.get(
        reverse("admin:soniq_django_deadletterjob_change", args=[job_id])).content.decode())
    assert "<td>charge</td>" in page


def test_the_admin_reads_the_steps_it_shows_and_counts_the_rest():
    source = OwnedJobSource("default")
    job_id = enqueue("tests.steps.three", {})
    run = run_of(source)
    for n in range(STEPS_SHOWN + 5):
        run.step(f"page-{n:04d}", lambda: None)
    with CaptureQueriesContext(connection) as queries:
        page = render_steps(job_id, "default")
    assert page.count("<tr><td>") == STEPS_SHOWN and "<td>page-0000</td>" in page
    assert f"<td>page-{STEPS_SHOWN:04d}</td>" not in page and "and 5 more" in page
    # The listing's read stops at STEPS_SHOWN rows; the rest are only counted.
    assert [q["sql"] for q in queries.captured_queries if "LIMIT" in q["sql"]], queries
    assert any("COUNT(" in q["sql"] for q in queries.captured_queries)


def test_a_job_without_steps_shows_a_dash(admin_client):
    job_id = enqueue("tests.steps.three", {})
    page = section(admin_client.get(
        reverse("admin:soniq_django_job_change", args=[job_id])).content.decode())
    assert "<td>" not in page and "-" in page


def test_signals_say_recorded_or_skipped_with_plain_values():
    heard = []

    def listen(signal, **kwargs):
        heard.append((signal, kwargs))

    signals.step_recorded.connect(listen, weak=False)
    signals.step_skipped.connect(listen, weak=False)
    try:
        source = OwnedJobSource("default")
        job_id = enqueue("tests.steps.three", {})
        run_of(source).step("a", lambda: {"token": SECRET}, atomic=True)
        lapse(job_id)
        run_of(source).step("a", lambda: 1 / 0)
    finally:
        signals.step_recorded.disconnect(listen)
        signals.step_skipped.disconnect(listen)
    (recorded, first), (skipped, second) = heard
    assert recorded is signals.step_recorded and skipped is signals.step_skipped
    assert first["sender"] == "tests.steps.three" and first["name"] == "a"
    assert (first["attempt"], first["atomic"], first["size"]) == (1, True, 29)
    assert (second["attempt"], second["atomic"], second["size"]) == (2, False, None)
    assert first["job_id"] == str(job_id) and first["using"] == "default"
    assert SECRET not in repr(heard)
