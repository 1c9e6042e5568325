"""The admin at a million rows (issue 28, item 7), on both databases.

What keeps the pages fast is checked on small tables: the planner's
estimates take over when ``estimates.COST_LIMIT`` is lowered to 0 (on
PostgreSQL, after an ANALYZE; SQLite counts exactly whatever the limit), the
search reads an id's range of the primary key or the search window, and
``key=value`` finds values inside args. ``make bench-admin`` measures the
same pages at 1,000,000 jobs (docs/performance.md).
"""

import datetime as dt
import uuid

import pytest
from django.db import connection
from django.db.models import Q
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from soniq_django import estimates, overview
from soniq_django.admin import scale
from soniq_django.admin.jobs import JobAdmin
from soniq_django.models import DeadLetterJob, Job

pytestmark = pytest.mark.django_db

POSTGRESQL = connection.vendor == "postgresql"
JOBS = reverse("admin:soniq_django_job_changelist")
DEAD = reverse("admin:soniq_django_deadletterjob_changelist")


def _job(id_text: str | None = None, *, args: dict | None = None, queue: str = "mail",
         status: str = "queued", age_minutes: int = 0, name: str = "shop.send") -> Job:
    created = timezone.now() - dt.timedelta(minutes=age_minutes)
    return Job.objects.create(
        id=uuid.UUID(id_text) if id_text else uuid.uuid4(), job_name=name, args=args or {},
        queue=queue, status=status, created_at=created, updated_at=created,
        expires_at=created + dt.timedelta(days=1) if status in ("done", "cancelled") else None)


def _analyze() -> None:
    if POSTGRESQL:
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE soniq_jobs")


def _ids(response) -> set[str]:
    return {str(job.id) for job in response.context["cl"].result_list}


@pytest.fixture
def estimating(monkeypatch):
    """Every count and DISTINCT an estimate where the database can estimate (PostgreSQL)."""
    monkeypatch.setattr(estimates, "COST_LIMIT", 0.0)


# -- search ---------------------------------------------------------------------------

def test_an_id_prefix_is_a_range_of_the_primary_key_not_a_text_match(admin_client):
    wanted = _job("0123abcd-ef01-4234-8567-89abcdef0123")
    near = _job("0123abce-0000-4000-8000-000000000000")
    named = _job("f123abcd-ef01-4234-8567-89abcdef0123", name="0123abcd")
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(JOBS, {"q": "0123abcd"})
    # Read now: the next request empties the log the capture reads.
    read = [q["sql"] for q in captured if '"soniq_jobs"' in q["sql"] and "WHERE" in q["sql"]]
    assert _ids(response) == {str(wanted.id)}  # an id's start: names are not searched
    assert _ids(admin_client.get(JOBS, {"q": "0123abc"})) == {str(named.id)}  # 7: a name
    assert _ids(admin_client.get(JOBS, {"q": "0123abcd-ef01"})) == {str(wanted.id)}
    assert _ids(admin_client.get(JOBS, {"q": "0123abc e".replace(" ", "")})) == {str(near.id)}
    assert _ids(admin_client.get(JOBS, {"q": str(wanted.id).upper()})) == {str(wanted.id)}
    assert read and all("LIKE" not in sql for sql in read)
    assert any("BETWEEN" in sql for sql in read)


def test_id_range_bounds():
    assert scale.id_range("0123abcd") == (uuid.UUID("0123abcd-0000-0000-0000-000000000000"),
                                          uuid.UUID("0123abcd-ffff-ffff-ffff-ffffffffffff"))
    assert scale.id_range("ffffffff-ffff-ffff-ffff-fffffffffff") is not None
    assert scale.id_range("0123abc") is None and scale.id_range("0123abcx") is None


def test_key_value_pairs_find_values_inside_args(admin_client):
    ann = _job(args={"customer": "cust-42", "order_id": 42, "paid": True})
    bob = _job(args={"customer": "cust-7", "order_id": 7, "paid": False, "name": "Bob Lee"})
    _job(args={"customer": "cust-420"})
    assert _ids(admin_client.get(JOBS, {"q": "customer=cust-42"})) == {str(ann.id)}
    assert _ids(admin_client.get(JOBS, {"q": "order_id=42"})) == {str(ann.id)}
    if POSTGRESQL:  # jsonb tells the text "42" from the number; SQLite's JSON does not
        assert _ids(admin_client.get(JOBS, {"q": """order_id='"42"'"""})) == set()
    assert _ids(admin_client.get(JOBS, {"q": "paid=false customer=cust-7"})) == {str(bob.id)}
    assert _ids(admin_client.get(JOBS, {"q": 'name="Bob Lee"'})) == {str(bob.id)}
    assert _ids(admin_client.get(JOBS, {"q": "customer=nobody"})) == set()


@pytest.mark.postgresql_only
def test_key_value_search_on_postgresql_is_jsonb_containment(admin_client):
    _job(args={"customer": "cust-42"})
    with CaptureQueriesContext(connection) as captured:
        admin_client.get(JOBS, {"q": "customer=cust-42"})
    assert any("@>" in q["sql"] for q in captured)


def test_args_pairs_parse():
    assert scale.args_pairs("a=1 b=x c=null") == {"a": 1, "b": "x", "c": None}
    assert scale.args_pairs('who="Ann Lee"') == {"who": "Ann Lee"}
    assert scale.args_pairs("refund") is None and scale.args_pairs("a=1 refund") is None
    assert scale.args_pairs('a="open') is None and scale.args_pairs("=1") is None


def test_a_search_reads_the_newest_rows_only_and_says_so(admin_client, monkeypatch):
    monkeypatch.setattr(scale, "SEARCH_WINDOW", 3)
    old = _job(args={"customer": "old"}, age_minutes=100, name="shop.refund")
    for minutes in (1, 2, 3):
        _job(args={"customer": "new"}, age_minutes=minutes)
    response = admin_client.get(JOBS, {"q": "customer=old"})
    assert _ids(response) == set()
    assert "The search read the newest 3 jobs only" in response.content.decode()
    assert _ids(admin_client.get(JOBS, {"q": "refund"})) == set()
    assert len(_ids(admin_client.get(JOBS, {"q": "customer=new"}))) == 3
    # An id is found wherever it is, and a date drill-down moves the window.
    assert _ids(admin_client.get(JOBS, {"q": str(old.id)[:8]})) == {str(old.id)}
    year = timezone.localtime(old.created_at).year
    monkeypatch.setattr(scale, "SEARCH_WINDOW", 4)
    found = admin_client.get(JOBS, {"q": "customer=old", "created_at__year": year})
    assert _ids(found) == {str(old.id)}
    assert "The search read" not in found.content.decode()  # 4 rows: all of them


# -- estimated counts -------------------------------------------------------------------

def test_counts_are_exact_when_cheap_and_estimates_otherwise(estimating):
    for _ in range(30):
        _job(status="done")
    _analyze()
    found = estimates.count(Job.objects.all())
    if POSTGRESQL:
        assert found.estimated and 20 <= found.value <= 40
    else:
        assert found == estimates.Count(30, estimated=False)
    assert estimates.count(Job.objects.all(), limit=1e12) == estimates.Count(30, False)


def test_an_estimated_count_reads_about_n_and_offers_at_most_max_pages(estimating, monkeypatch):
    monkeypatch.setattr(scale, "MAX_PAGES", 2)
    for _ in range(30):
        _job(status="done")
    _analyze()
    paginator = scale.EstimatingPaginator(Job.objects.order_by("-created_at"), 5)
    assert paginator.estimated is POSTGRESQL
    if POSTGRESQL:
        assert str(paginator.count) == f"about {int(paginator.count):,}"
        assert paginator.num_pages == 2
    else:
        assert paginator.count == 30 and str(paginator.count) == "30"
        assert paginator.num_pages == 6
    exact = scale.ExactPaginator(Job.objects.order_by("-created_at"), 5)
    assert not exact.estimated and exact.count == 30


def test_the_list_says_about_n_jobs_and_why(admin_client, estimating):
    for _ in range(60):
        _job(status="done")
    _analyze()
    page = admin_client.get(JOBS).content.decode()
    if POSTGRESQL:
        assert "about " in page and "counting every row would read the whole table" in page
    else:
        assert "60 jobs" in page and "about " not in page


def test_estimated_filters_and_dates_read_no_row(admin_client, estimating):
    for queue in ("mail",) * 6 + ("reports",) * 4:
        _job(queue=queue, status="done")
    _analyze()
    with CaptureQueriesContext(connection) as captured:
        response = admin_client.get(JOBS, {"queue": "chosen-in-the-url"})
    assert response.status_code == 200
    page = response.content.decode()
    assert ">mail<" in page and ">reports<" in page
    assert (">chosen-in-the-url<" in page) is POSTGRESQL  # estimated: the chosen one too
    assert "_facets" not in page  # "Show counts" would count each value over the table
    distinct = [q["sql"] for q in captured
                if "DISTINCT" in q["sql"] and not q["sql"].startswith("EXPLAIN")]
    if POSTGRESQL:
        assert "created_at__day=" in page  # the drill-down at this month's days, all of them
        assert distinct == []  # neither the filters' values nor the drill-down's dates
    else:
        assert distinct  # SQLite: Django's own, exact


# -- the running jobs, apart (decision 0051) -----------------------------------------------

def _mixed() -> list[str]:
    """Jobs in every state, one a minute apart, processing ones among them: their ids newest
    first."""
    states = ["queued", "processing", "done", "processing", "cancelled", "queued", "done",
              "processing", "done", "queued"]
    made = [_job(status=status, age_minutes=minute) for minute, status in enumerate(states)]
    return [str(job.id) for job in made]  # minute 0 first: the newest


def test_the_created_index_leaves_out_processing_rows():
    [index] = [index for index in Job._meta.indexes if index.name == "soniq_jobs_created_idx"]
    assert index.fields == ["created_at"] and index.condition == ~Q(status="processing")
    if POSTGRESQL:
        with connection.cursor() as cursor:
            cursor.execute("SELECT indexdef FROM pg_indexes "
                           "WHERE indexname = 'soniq_jobs_created_idx'")
            [(definition,)] = cursor.fetchall()
        assert "WHERE (NOT (status = 'processing'::text))" in definition


def test_the_newest_first_list_merges_the_running_jobs_in_order_on_every_page(
        admin_client, monkeypatch):
    newest_first = _mixed()
    monkeypatch.setattr(JobAdmin, "list_per_page", 3)
    shown = []
    for page in (1, 2, 3, 4):
        with CaptureQueriesContext(connection) as captured:
            response = admin_client.get(JOBS, {"p": page})
        assert response.context["cl"].result_count == 10
        shown += [str(job.id) for job in response.context["cl"].result_list]
        ordered = [q["sql"] for q in captured if 'FROM "soniq_jobs"' in q["sql"]
                   and "ORDER BY" in q["sql"] and "LIMIT" in q["sql"]]
        # Two reads of the page, each by one index: the rows it holds, the running ones.
        assert len(ordered) == 2, ordered
        assert """NOT ("soniq_jobs"."status" = 'processing')""" in ordered[0]
        assert """"soniq_jobs"."status" = 'processing'""" in ordered[1]
    assert shown == newest_first


def test_counts_add_the_running_jobs_to_the_rest(estimating):
    _mixed()
    _analyze()
    for kind in (scale.ExactPaginator, scale.EstimatingPaginator):
        paginator = kind(Job.objects.order_by("-created_at", "-pk"), 3)
        paginator.apart = JobAdmin.apart
        if kind is scale.ExactPaginator or not POSTGRESQL:
            assert paginator.count == 10 and not paginator.estimated
        assert [str(job.id) for job in paginator.page(2).object_list] == _newest_ids()[3:6]


def _newest_ids() -> list[str]:
    return [str(pk) for pk in Job.objects.order_by("-created_at", "-pk")
            .values_list("pk", flat=True)]


def test_a_list_of_one_status_and_another_order_read_as_before(admin_client):
    newest_first = _mixed()
    running = admin_client.get(JOBS, {"status__exact": "processing"})
    assert [str(job.id) for job in running.context["cl"].result_list] == [
        newest_first[1], newest_first[3], newest_first[7]]
    oldest_first = admin_client.get(JOBS, {"o": "-9"})  # any other order: Django's own page
    assert running.status_code == oldest_first.status_code == 200


def test_the_drill_down_ends_and_the_search_window_see_the_running_jobs(
        admin_client, estimating, monkeypatch):
    newest = _job(status="done")
    ancient = _job(status="processing", args={"customer": "c"}, age_minutes=60 * 24 * 800)
    _analyze()
    page = admin_client.get(JOBS).content.decode()
    if POSTGRESQL:  # an estimated count: the drill-down lists the years between the ends
        assert f"created_at__year={timezone.localtime(ancient.created_at).year}" in page
    assert scale.Apart("created_at", Q(status="processing")).ends(Job.objects.all()) == (
        ancient.created_at, newest.created_at)
    # The window: the newest rows the index holds (here two: the done jobs 0 and 10
    # minutes old), and the running jobs among them.
    monkeypatch.setattr(scale, "SEARCH_WINDOW", 2)
    _job(status="done", age_minutes=10)
    _job(status="done", age_minutes=20)
    recent = _job(status="processing", args={"customer": "c"}, age_minutes=1)
    with CaptureQueriesContext(connection) as captured:
        found = admin_client.get(JOBS, {"q": "customer=c"})
    assert _ids(found) == {str(recent.id)}  # the old running job is outside the window
    # One page holds them all: read arm by arm too, never by the whole table's order.
    listed = [q["sql"] for q in captured if 'FROM "soniq_jobs"' in q["sql"]
              and "ORDER BY" in q["sql"] and "COUNT" not in q["sql"]
              and "DISTINCT" not in q["sql"]]  # (the filters' choices)
    assert listed and all("processing" in sql for sql in listed), listed


@pytest.mark.postgresql_only
def test_each_arm_reads_an_index_not_the_table():
    _mixed()
    _analyze()
    rest, running = JobAdmin.apart.arms(Job.objects.all())
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        for arm, index in ((rest, "soniq_jobs_created_idx"), (running, "soniq_jobs_lease_idx")):
            sql, params = (arm.order_by("-created_at", "-pk").values_list("created_at", "pk")[:10]
                           .query.sql_with_params())
            cursor.execute("EXPLAIN " + sql, params)
            plan = "\n".join(row[0] for row in cursor.fetchall())
            assert index in plan and "Seq Scan" not in plan, plan


# -- the dashboard ------------------------------------------------------------------------

def test_dashboard_estimates_finished_jobs_and_counts_live_ones(admin_client, estimating):
    for i in range(40):
        _job(queue="mail" if i % 4 else "reports", status="done")
    for i in range(6):
        _job(queue="mail", status="queued")
    _job(queue="reports", status="cancelled")
    _analyze()
    view = overview.snapshot(estimate=True)
    cells = {row.queue: dict(row.cells) for row in view.queues}
    assert cells["mail"]["queued"] == 6  # counted, always
    if POSTGRESQL:
        assert view.estimated == {"done", "cancelled"}
        finished = sum(c["done"] + c["cancelled"] for c in cells.values())
        assert 35 <= finished <= 47
        page = admin_client.get(reverse("admin:soniq_django_dashboard")).content.decode()
        assert 'data-estimated="true"' in page and "≈" in page
        live = admin_client.get(reverse("admin:soniq_django_dashboard_live")).json()
        assert live["figures"]["estimated"] == ["cancelled", "done"]
    else:
        assert view.estimated == frozenset()
        assert cells["mail"]["done"] == 30 and cells["reports"]["done"] == 10
        assert cells["reports"]["cancelled"] == 1
    exact = overview.snapshot()  # soniq_status: always counted
    assert exact.estimated == frozenset()
    assert {row.queue: dict(row.cells)["done"] for row in exact.queues} == {
        "mail": 30, "reports": 10}


def test_oldest_due_reads_unscheduled_and_fallen_due_scheduled_jobs():
    now = timezone.now()
    _job(queue="mail", age_minutes=5)
    scheduled = _job(queue="later", age_minutes=60)
    Job.objects.filter(id=scheduled.id).update(scheduled_at=now - dt.timedelta(minutes=10))
    future = _job(queue="future", age_minutes=60)
    Job.objects.filter(id=future.id).update(scheduled_at=now + dt.timedelta(minutes=10))
    waits = {row.queue: row.oldest_wait for row in overview.snapshot(now=now).queues}
    assert dt.timedelta(minutes=4) < waits["mail"] <= dt.timedelta(minutes=6)
    assert dt.timedelta(minutes=9) < waits["later"] <= dt.timedelta(minutes=11)
    assert waits["future"] is None


def test_dead_letters_keep_a_window_and_id_search(admin_client, monkeypatch):
    monkeypatch.setattr(scale, "SEARCH_WINDOW", 2)
    now = timezone.now()
    rows = [DeadLetterJob.objects.create(
        id=uuid.uuid4(), job_name="billing.charge", args={"customer": f"c{i}"}, queue="billing",
        dead_letter_reason="permanent_failure", moved_to_dead_letter_at=now - dt.timedelta(
            minutes=i)) for i in range(3)]
    assert _ids(admin_client.get(DEAD, {"q": "customer=c0"})) == {str(rows[0].id)}
    assert _ids(admin_client.get(DEAD, {"q": "customer=c2"})) == set()
    assert _ids(admin_client.get(DEAD, {"q": str(rows[2].id)[:8]})) == {str(rows[2].id)}
