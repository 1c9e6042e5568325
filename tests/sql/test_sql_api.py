"""soniq_enqueue and soniq_get_job, called as SQL on the real PostgreSQL server.

Every failure is checked by its SQLSTATE and, for 22023, by the exact
``SONIQ_…`` code in the HINT, as a producer in another language sees them.
These tests run inside the test's transaction; concurrency, NOTIFY and roles
are in test_sql_concurrency.py and test_sql_trust.py.
"""

import datetime as dt
import json
import math
import uuid

import pytest
from django.db import DatabaseError, connection, transaction
from django.utils import timezone

from soniq_django import args_hash
from soniq_django.errors import ErrorCode
from soniq_django.models import DeadLetterJob, Job
from soniq_django.errors import translate

from tests.support.sql import FLOAT64_OVERFLOW, GET_JOB_COLUMNS, fails, fetch, job_count, nested, value

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db]

def enqueue(job_name="billing.send_invoice", args="{}", **options):
    """Call soniq_enqueue with named options; return the id it gives."""
    named = "".join(f", {name} => %s" for name in options)
    return value(f"SELECT soniq_enqueue(%s, %s::jsonb{named})", [job_name, args, *options.values()])


def enqueue_fails(job_name="billing.send_invoice", args="{}", **options):
    named = "".join(f", {name} => %s" for name in options)
    return fails(f"SELECT soniq_enqueue(%s, %s::jsonb{named})", [job_name, args, *options.values()])


def assert_rejected(error, hint):
    assert (error.sqlstate, error.diag.message_hint) == ("22023", hint)


# --------------------------------------------------------------------------
# Job names


@pytest.mark.parametrize(
    "name",
    ["Billing.send", "billing..send", "billing.", ".billing", "1abc", "a-b", "", "a.b\n", "\na.b",
     "ä", "billing.Send", " billing", "billing send", "billing.1send", "_billing"],
)
def test_a_name_outside_the_default_pattern_is_refused(name):
    assert_rejected(enqueue_fails(name), "SONIQ_INVALID_TASK_NAME")
    assert job_count() == 0


def test_a_null_name_is_refused():
    assert_rejected(enqueue_fails(None), "SONIQ_INVALID_TASK_NAME")


@pytest.mark.parametrize("name", ["a", "billing.send_invoice", "a1.b_2.c_3", "x" * 300, "a__b.c9"])
def test_names_inside_the_default_pattern_are_accepted(name):
    job_id = enqueue(name)
    assert Job.objects.get(id=job_id).job_name == name


def _alter_database(clause):
    database = connection.ops.quote_name(connection.settings_dict["NAME"])
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER DATABASE {database} {clause}")  # rolled back with the test


def test_the_database_level_pattern_is_enforced():
    _alter_database("SET soniq.task_name_pattern = '^[A-Z]+$'")
    assert enqueue("UPPER")
    assert_rejected(enqueue_fails("billing.send_invoice"), "SONIQ_INVALID_TASK_NAME")
    _alter_database("RESET soniq.task_name_pattern")
    assert enqueue("billing.send_invoice")
    assert_rejected(enqueue_fails("UPPER"), "SONIQ_INVALID_TASK_NAME")


def test_a_database_level_pattern_can_also_loosen_the_check():
    _alter_database("SET soniq.task_name_pattern = '^.+$'")
    assert enqueue("Anything Goes-1")


def test_a_similarly_named_database_setting_is_not_the_pattern():
    _alter_database("SET soniq.task_name_pattern_extra = '^.+$'")
    assert_rejected(enqueue_fails("Not Allowed"), "SONIQ_INVALID_TASK_NAME")


@pytest.mark.parametrize(
    "statement",
    [
        "SET soniq.task_name_pattern = '^.+$'",
        "SET LOCAL soniq.task_name_pattern = '^.+$'",
        "SELECT set_config('soniq.task_name_pattern', '^.+$', false)",
    ],
)
def test_a_callers_own_setting_changes_nothing(statement):
    fetch(statement)
    assert value("SELECT current_setting('soniq.task_name_pattern')") == "^.+$"
    assert_rejected(enqueue_fails("Not Allowed"), "SONIQ_INVALID_TASK_NAME")
    assert enqueue("billing.send_invoice")
    fetch("RESET soniq.task_name_pattern")


# --------------------------------------------------------------------------
# Args


@pytest.mark.parametrize("args", ["[]", "[1, 2]", '"text"', "1", "1.5", "true", "false", "null"])
def test_args_that_are_not_an_object_are_refused(args):
    assert_rejected(enqueue_fails(args=args), "SONIQ_TASK_ARGS_INVALID")
    assert job_count() == 0


def test_sql_null_args_are_refused():
    assert_rejected(enqueue_fails(args=None), "SONIQ_TASK_ARGS_INVALID")


def test_args_default_to_an_empty_object():
    job_id = value("SELECT soniq_enqueue('reports.daily')")
    assert Job.objects.get(id=job_id).args == {}


def _python_reads_finite(literal: str) -> bool:
    try:
        number = float(int(literal)) if literal.lstrip("-").isdigit() else float(literal)
    except OverflowError:
        return False
    return math.isfinite(number)


@pytest.mark.parametrize(
    ("literal", "accepted"),
    [
        ("1e400", False),
        ("-1e400", False),
        ("1e309", False),
        ("1.8e308", False),
        (str(2**1024), False),
        (str(FLOAT64_OVERFLOW), False),
        (str(-FLOAT64_OVERFLOW), False),
        (str(FLOAT64_OVERFLOW - 1), True),
        ("1.7976931348623157e308", True),
        ("-1.7976931348623157e308", True),
        ("1.7976931348623158e308", True),  # still rounds to the largest float64
        ("5e-324", True),
        ("1e-400", True),  # underflows to 0.0, which is finite
        ("0", True),
    ],
)
def test_numbers_beyond_float64_are_refused(literal, accepted):
    assert _python_reads_finite(literal) is accepted  # the rule is "what Python reads as finite"
    for args in ('{"n": %s}' % literal, '{"a": [1, {"b": [%s]}]}' % literal):
        if accepted:
            assert enqueue(args=args)
        else:
            assert_rejected(enqueue_fails(args=args), "SONIQ_TASK_ARGS_INVALID")


@pytest.mark.parametrize("kind", ["object", "array", "mixed"])
def test_nesting_499_levels_is_accepted_and_500_refused(kind):
    deepest = nested(499, kind, leaf="1")
    job_id = enqueue(args=deepest)
    assert Job.objects.filter(id=job_id).exists()
    assert_rejected(enqueue_fails(args=nested(500, kind)), "SONIQ_TASK_ARGS_INVALID")
    assert_rejected(enqueue_fails(args=nested(2000, kind)), "SONIQ_TASK_ARGS_INVALID")
    assert job_count() == 1


def test_the_nesting_helper_counts_the_args_object_as_level_one():
    def depth(value):
        if isinstance(value, dict):
            return 1 + max((depth(v) for v in value.values()), default=0)
        if isinstance(value, list):
            return 1 + max((depth(v) for v in value), default=0)
        return 0

    assert [depth(json.loads(nested(n, "mixed"))) for n in (1, 2, 3, 40)] == [1, 2, 3, 40]
    assert depth(json.loads(nested(40, "array", leaf="1"))) == 40


def test_nul_in_args_fails_before_the_function_runs():
    for args in ('{"a": "x\\u0000y"}', '{"x\\u0000": 1}'):
        error = enqueue_fails(args=args)
        assert error.sqlstate == "22P05"
        assert error.diag.message_hint is None
    assert job_count() == 0


# --------------------------------------------------------------------------
# max_attempts and the other options


@pytest.mark.parametrize("max_attempts", [0, -1, -(2**31)])
def test_max_attempts_below_one_is_refused(max_attempts):
    assert_rejected(enqueue_fails(max_attempts=max_attempts), "SONIQ_INVALID_MAX_ATTEMPTS")
    assert job_count() == 0


@pytest.mark.parametrize("max_attempts", [1, 2**31 - 1, None])
def test_max_attempts_one_and_up_or_null_is_stored(max_attempts):
    job_id = enqueue(max_attempts=max_attempts)
    assert value("SELECT max_attempts FROM soniq_jobs WHERE id = %s", [job_id]) == max_attempts


@pytest.mark.parametrize(
    ("option", "bad"),
    [("queue", ""), ("queue", "q" * 256), ("dedup_key", ""), ("dedup_key", "k" * 256),
     ("producer_id", ""), ("producer_id", "p" * 256), ("queue", "é" * 256)],
)
def test_empty_or_over_long_text_options_are_refused(option, bad):
    error = enqueue_fails(**{option: bad})
    assert_rejected(error, "SONIQ_INVALID_OPTION")
    assert option in error.diag.message_primary
    assert job_count() == 0


@pytest.mark.parametrize("option", ["queue", "dedup_key", "producer_id"])
@pytest.mark.parametrize("text", ["x" * 255, "é" * 255, "😀" * 255])
def test_text_options_of_255_characters_are_accepted(option, text):
    job_id = enqueue(**{option: text})
    assert value(f"SELECT {option} FROM soniq_jobs WHERE id = %s", [job_id]) == text


def test_an_existing_job_id_raises_23505():
    job_id = enqueue()
    error = enqueue_fails(job_id=job_id)
    assert error.sqlstate == "23505"
    assert error.diag.constraint_name == "soniq_jobs_pkey"
    assert job_count() == 1


MARKER = "s3cret-payload-marker"


@pytest.mark.parametrize(
    ("job_name", "args", "options"),
    [
        ("Bad Name", {"token": MARKER}, {}),
        ("a.b", [MARKER], {}),
        ("a.b", {MARKER: 1e400}, {}),
        ("a.b", {"token": MARKER, "n": -1e400}, {}),
        ("a.b", None, {}),
        ("a.b", {"token": MARKER}, {"max_attempts": 0}),
        ("a.b", {"token": MARKER}, {"queue": ""}),
        ("a.b", {"token": MARKER}, {"dedup_key": "k" * 300}),
        ("a.b", {"token": MARKER}, {"producer_id": ""}),
    ],
)
def test_error_messages_never_echo_the_args(job_name, args, options):
    if args is None:
        text = nested(500, "mixed", leaf=json.dumps(MARKER))
    else:
        text = json.dumps(args).replace("Infinity", "1e400")
    error = enqueue_fails(job_name, text, **options)
    assert error.sqlstate == "22023"
    diag = error.diag
    for field in (str(error), diag.message_primary, diag.message_detail, diag.message_hint,
                  diag.context, diag.internal_query):
        assert MARKER not in (field or "")


def test_a_duplicate_id_error_does_not_echo_the_args():
    job_id = enqueue(args=json.dumps({"token": MARKER}))
    error = enqueue_fails(args=json.dumps({"token": MARKER}), job_id=job_id)
    assert error.sqlstate == "23505"
    for field in (str(error), error.diag.message_detail, error.diag.context):
        assert MARKER not in (field or "")


# --------------------------------------------------------------------------
# Parameters and defaults


def test_the_parameters_are_the_seeds_names_in_order():
    names, result = fetch(
        "SELECT p.proargnames, p.prorettype::regtype::text FROM pg_proc AS p "
        "WHERE p.oid = 'soniq_enqueue'::regproc"
    )[0]
    assert names == ["job_name", "args", "queue", "priority", "run_at", "max_attempts",
                     "unique_job", "dedup_key", "producer_id", "job_id"]
    assert result == "uuid"


def test_defaults_are_the_seeds():
    fetch("SET LOCAL application_name = ''")
    job_id = value("SELECT soniq_enqueue('billing.send_invoice', '{\"order_id\": 123}')")
    row = fetch(
        "SELECT job_name, args, args_hash, status, attempts, max_attempts, queue, priority, "
        "unique_job, dedup_key, scheduled_at, expires_at, last_error, result, producer_id, "
        "worker_id, created_at, updated_at, now(), session_user FROM soniq_jobs WHERE id = %s",
        [job_id],
    )[0]
    (name, args, hashed, status, attempts, max_attempts, queue, priority, unique, dedup,
     scheduled_at, expires_at, last_error, result, producer, worker, created, updated, now,
     session_user) = row
    assert (name, json.loads(args), hashed, status, attempts) == (
        "billing.send_invoice", {"order_id": 123}, None, "queued", 0)
    assert (max_attempts, queue, priority, unique, dedup) == (4, "default", 100, False, None)
    assert (scheduled_at, expires_at, last_error, result, worker) == (None, None, None, None, None)
    assert producer == session_user
    assert created == updated and dt.timedelta(0) <= created - now < dt.timedelta(seconds=60)


def test_producer_id_defaults_to_application_name():
    fetch("SET LOCAL application_name = 'checkout-go'")
    job_id = enqueue()
    assert value("SELECT producer_id FROM soniq_jobs WHERE id = %s", [job_id]) == "checkout-go"
    explicit = enqueue(producer_id="billing-node")
    assert value("SELECT producer_id FROM soniq_jobs WHERE id = %s", [explicit]) == "billing-node"


def test_job_ids_are_random_version_4_uuids():
    ids = [enqueue(args=json.dumps({"n": n})) for n in range(40)]
    assert len(set(ids)) == 40
    assert all(isinstance(i, uuid.UUID) and i.version == 4 and i.variant == uuid.RFC_4122
               for i in ids)


def test_every_named_parameter_is_stored():
    run_at = timezone.now() + dt.timedelta(hours=1)
    wanted = uuid.uuid4()
    # Named notation, in an order of our own.
    returned = value(
        "SELECT soniq_enqueue(job_id => %s, producer_id => %s, dedup_key => %s, "
        "unique_job => %s, max_attempts => %s, run_at => %s, priority => %s, queue => %s, "
        "args => %s::jsonb, job_name => %s)",
        [wanted, "checkout-go", "invoice-123", True, 7, run_at, 10, "billing",
         '{"order_id": 123}', "billing.send_invoice"],
    )
    assert returned == wanted
    row = Job.objects.get(id=wanted)
    assert (row.job_name, row.args, row.queue, row.priority, row.scheduled_at) == (
        "billing.send_invoice", {"order_id": 123}, "billing", 10, run_at)
    assert (row.max_attempts, row.unique_job, row.dedup_key, row.producer_id) == (
        7, True, "invoice-123", "checkout-go")
    assert row.args_hash == args_hash({"order_id": 123})


def test_positional_call_with_every_parameter():
    wanted = uuid.uuid4()
    returned = value(
        "SELECT soniq_enqueue('a.b', '{}', 'q', 5, NULL, 2, false, NULL, 'p', %s)", [wanted]
    )
    assert returned == wanted
    row = Job.objects.get(id=wanted)
    assert (row.queue, row.priority, row.scheduled_at, row.max_attempts, row.producer_id) == (
        "q", 5, None, 2, "p")


def test_null_queue_priority_and_unique_job_mean_the_defaults():
    job_id = enqueue(queue=None, priority=None, unique_job=None, run_at=None)
    row = Job.objects.get(id=job_id)
    assert (row.queue, row.priority, row.unique_job, row.scheduled_at) == (
        "default", 100, False, None)


def test_negative_and_large_priorities_are_stored():
    for priority in (-(2**31), 0, 2**31 - 1):
        job_id = enqueue(priority=priority)
        assert Job.objects.get(id=job_id).priority == priority


# --------------------------------------------------------------------------
# Unique jobs and dedup keys


def test_unique_job_returns_the_queued_duplicate():
    first = enqueue("reports.build", '{"day": "2024-01-01", "n": [1, 2]}', unique_job=True)
    again = enqueue("reports.build", '{"n":[1,2],  "day":"2024-01-01"}', unique_job=True)
    other_queue = enqueue("reports.build", '{"day": "2024-01-01", "n": [1, 2]}',
                          unique_job=True, queue="elsewhere", priority=1)
    assert first == again == other_queue
    assert job_count() == 1
    row = Job.objects.get(id=first)
    assert (row.queue, row.priority) == ("default", 100)  # the duplicate changed nothing
    expected = args_hash({"day": "2024-01-01", "n": [1, 2]})
    assert row.args_hash == expected == value("SELECT soniq_args_hash(args) FROM soniq_jobs")


def test_unique_job_identity_is_name_and_args():
    a = enqueue("reports.a", '{"day": "d"}', unique_job=True)
    b = enqueue("reports.b", '{"day": "d"}', unique_job=True)
    c = enqueue("reports.a", '{"day": "e"}', unique_job=True)
    d = enqueue("reports.a", '{"day": "d", "x": null}', unique_job=True)
    assert len({a, b, c, d}) == 4


def test_a_plain_job_never_deduplicates():
    plain = [enqueue("reports.a", '{"day": "d"}') for _ in range(2)]
    unique = enqueue("reports.a", '{"day": "d"}', unique_job=True)
    assert len({*plain, unique}) == 3
    assert Job.objects.filter(args_hash__isnull=True).count() == 2
    assert enqueue("reports.a", '{"day": "d"}', unique_job=True) == unique


def test_a_duplicate_ignores_the_requested_job_id():
    first = enqueue("reports.a", '{"day": "d"}', unique_job=True)
    assert enqueue("reports.a", '{"day": "d"}', unique_job=True, job_id=uuid.uuid4()) == first
    by_key = enqueue("reports.b", dedup_key="k1")
    assert enqueue("reports.c", dedup_key="k1", job_id=uuid.uuid4()) == by_key
    assert job_count() == 2


@pytest.mark.parametrize("status", ["processing", "done", "cancelled"])
def test_after_the_duplicate_leaves_queued_a_new_job_is_created(status):
    unique = enqueue("reports.a", '{"day": "d"}', unique_job=True)
    keyed = enqueue("reports.b", dedup_key="invoice-1")
    Job.objects.filter(id__in=[unique, keyed]).update(status=status)
    new_unique = enqueue("reports.a", '{"day": "d"}', unique_job=True)
    new_keyed = enqueue("reports.b", dedup_key="invoice-1")
    assert len({unique, keyed, new_unique, new_keyed}) == 4
    # ... and the new ones are now what later duplicates return.
    assert enqueue("reports.a", '{"day": "d"}', unique_job=True) == new_unique
    assert enqueue("reports.b", dedup_key="invoice-1") == new_keyed


def test_dedup_key_is_one_namespace_across_names_and_queues():
    first = enqueue("billing.send_invoice", '{"order_id": 1}', dedup_key="invoice-1")
    assert enqueue("mail.other", '{"x": 1}', queue="mail", dedup_key="invoice-1") == first
    assert enqueue("billing.send_invoice", '{"order_id": 1}', dedup_key="invoice-2") != first
    row = Job.objects.get(id=first)
    assert (row.job_name, row.queue, row.args_hash, row.unique_job) == (
        "billing.send_invoice", "default", None, False)
    assert job_count() == 2


def test_unique_job_with_a_dedup_key():
    both = enqueue("reports.a", '{"day": "d"}', unique_job=True, dedup_key="k1")
    row = Job.objects.get(id=both)
    assert (row.unique_job, row.dedup_key, row.args_hash) == (True, "k1", args_hash({"day": "d"}))
    # The same key, other args and name: the key matches.
    assert enqueue("reports.z", '{"day": "other"}', unique_job=True, dedup_key="k1") == both
    # Another key, the same name and args: the args_hash matches.
    assert enqueue("reports.a", '{"day": "d"}', unique_job=True, dedup_key="k2") == both
    # A plain call with the key, and a unique call without one, also find it.
    assert enqueue("reports.q", dedup_key="k1") == both
    assert enqueue("reports.a", '{"day": "d"}', unique_job=True) == both
    assert job_count() == 1
    # Neither matches: a new job holding both.
    fresh = enqueue("reports.a", '{"day": "e"}', unique_job=True, dedup_key="k3")
    assert fresh != both and job_count() == 2


def test_the_key_wins_when_key_and_args_match_different_jobs():
    keyed = enqueue("reports.a", '{"day": "x"}', dedup_key="k1")
    hashed = enqueue("reports.b", '{"day": "d"}', unique_job=True)
    assert enqueue("reports.b", '{"day": "d"}', unique_job=True, dedup_key="k1") == keyed
    assert keyed != hashed and job_count() == 2


# --------------------------------------------------------------------------
# soniq_get_job

TYPE_OIDS = {"uuid": 2950, "text": 25, "int4": 23, "jsonb": 3802, "timestamptz": 1184}
COLUMN_TYPES = ("uuid", "text", "text", "text", "int4", "int4", "jsonb", "text", "text",
                "timestamptz", "timestamptz", "timestamptz")


def get_job(job_id):
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM soniq_get_job(%s)", [job_id])
        description = cursor.description
        rows = cursor.fetchall()
    assert tuple(column.name for column in description) == GET_JOB_COLUMNS
    assert tuple(column.type_code for column in description) == tuple(
        TYPE_OIDS[t] for t in COLUMN_TYPES)
    assert len(rows) <= 1
    return dict(zip(GET_JOB_COLUMNS, rows[0])) if rows else None


def test_get_job_returns_the_seeds_columns_in_order():
    run_at = timezone.now() + dt.timedelta(minutes=5)
    job_id = enqueue("billing.send_invoice", '{"order_id": 1}', queue="billing",
                     max_attempts=3, run_at=run_at)
    row = get_job(job_id)
    assert row["id"] == job_id
    assert (row["job_name"], row["status"], row["queue"], row["attempts"],
            row["max_attempts"]) == ("billing.send_invoice", "queued", "billing", 0, 3)
    assert (row["result"], row["last_error"], row["dead_letter_reason"]) == (None, None, None)
    assert row["scheduled_at"] == run_at
    assert row["created_at"] is not None and row["updated_at"] is not None


def test_get_job_of_a_finished_job_shows_its_result_until_it_expires():
    job_id = enqueue()
    Job.objects.filter(id=job_id).update(
        status="done", attempts=1, result={"ok": [1, "two"]},
        expires_at=timezone.now() + dt.timedelta(minutes=5),
    )
    row = get_job(job_id)
    assert (row["status"], row["attempts"], json.loads(row["result"])) == (
        "done", 1, {"ok": [1, "two"]})
    Job.objects.filter(id=job_id).update(expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert get_job(job_id) is None


def test_get_job_of_an_expired_cancelled_job_is_no_row():
    job_id = enqueue()
    Job.objects.filter(id=job_id).update(
        status="cancelled", expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert get_job(job_id) is None


def test_get_job_of_a_failing_job_shows_the_last_error():
    job_id = enqueue()
    Job.objects.filter(id=job_id).update(status="processing", attempts=2, last_error="boom")
    row = get_job(job_id)
    assert (row["status"], row["attempts"], row["last_error"]) == ("processing", 2, "boom")


def test_get_job_of_unknown_ids_is_no_row():
    assert get_job(uuid.uuid4()) is None
    assert get_job(None) is None


def test_get_job_of_a_dead_lettered_job():
    job_id = uuid.uuid4()
    created = timezone.now() - dt.timedelta(hours=1)
    DeadLetterJob.objects.create(
        id=job_id, job_name="billing.send_invoice", args={"order_id": 1}, queue="billing",
        attempts=4, max_attempts=4, last_error="gave up", dead_letter_reason="permanent_failure",
        original_created_at=created,
    )
    row = get_job(job_id)
    assert (row["id"], row["status"], row["dead_letter_reason"], row["last_error"]) == (
        job_id, "dead_letter", "permanent_failure", "gave up")
    assert (row["job_name"], row["queue"], row["attempts"], row["max_attempts"]) == (
        "billing.send_invoice", "billing", 4, 4)
    assert row["result"] is None and row["scheduled_at"] is None
    dead = DeadLetterJob.objects.get(id=job_id)
    assert (row["created_at"], row["updated_at"]) == (created, dead.moved_to_dead_letter_at)


def test_get_job_of_a_replayed_dead_letter_describes_the_replayed_job():
    job_id = uuid.uuid4()
    moved = timezone.now() - dt.timedelta(minutes=10)
    DeadLetterJob.objects.create(
        id=job_id, job_name="billing.send_invoice", args={}, attempts=4, max_attempts=4,
        dead_letter_reason="max_retries_exceeded", moved_to_dead_letter_at=moved,
        resurrection_count=1, last_resurrection_at=moved + dt.timedelta(minutes=1),
    )
    # Replayed: the job is queued again under its id (as soniq_django.replay
    # inserts it; soniq_enqueue refuses an id the dead letters hold), and
    # get_job shows that row ...
    Job.objects.create(id=job_id, job_name="billing.send_invoice", args={})
    assert get_job(job_id)["status"] == "queued"
    # ... and once that run finished and expired, the old dead letter is not shown instead.
    Job.objects.filter(id=job_id).update(
        status="done", expires_at=timezone.now() - dt.timedelta(seconds=1))
    assert get_job(job_id) is None
    # A dead letter that failed again after its replay is shown.
    DeadLetterJob.objects.filter(id=job_id).update(moved_to_dead_letter_at=timezone.now())
    Job.objects.filter(id=job_id).delete()
    assert get_job(job_id)["status"] == "dead_letter"


# --------------------------------------------------------------------------
# Python's mapping of these errors (soniq_django.errors.translate)


def _django_error(sql, params=()):
    try:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute(sql, params)
    except DatabaseError as error:
        return error
    raise AssertionError("expected a database error")


@pytest.mark.parametrize(
    ("call", "code", "error_class"),
    [
        ("soniq_enqueue('Bad Name', '{}')", "SONIQ_INVALID_TASK_NAME", "ConfigValidationError"),
        ("soniq_enqueue('a.b', '[]')", "SONIQ_TASK_ARGS_INVALID", "ConfigValidationError"),
        ("soniq_args_hash('{\"n\": 1e400}')", "SONIQ_TASK_ARGS_INVALID",
         "ConfigValidationError"),
        ("soniq_enqueue('a.b', '{}', max_attempts => 0)", "SONIQ_INVALID_MAX_ATTEMPTS",
         "ConfigValidationError"),
        ("soniq_enqueue('a.b', '{}', queue => '')", "SONIQ_INVALID_OPTION",
         "ConfigValidationError"),
    ],
)
def test_python_maps_each_hint_to_the_same_error_code(call, code, error_class):
    translated = translate(_django_error(f"SELECT {call}"))
    assert type(translated).__name__ == error_class
    assert translated.code == code


def test_python_maps_an_existing_job_id_and_refuses_the_rest_by_sqlstate():
    job_id = enqueue()
    translated = translate(_django_error("SELECT soniq_enqueue('a.b', '{}', job_id => %s)",
                                         [job_id]))
    assert translated.code is ErrorCode.DUPLICATE_JOB_ID
    assert str(job_id) not in str(translated)
    # Errors that are not the API's own are refusals that name their SQLSTATE only.
    for sql, state in [
        ("SELECT soniq_enqueue('a.b', '{\"a\": \"\\u0000\"}')", "22P05"),
        ("SELECT 1/0", "22012"),
        ("DO $$ BEGIN RAISE EXCEPTION 'x' USING ERRCODE = '22023', HINT = 'SOMETHING_ELSE'; "
         "END $$", "22023"),
    ]:
        translated = translate(_django_error(sql))
        assert translated.code is ErrorCode.QUEUE_DATABASE_REFUSED
        assert translated.reason == f"the database refused the operation (SQLSTATE {state})"
