"""soniq_enqueue_many (producer API v2), and the args length bound of v2's soniq_enqueue.

Called as SQL on the real PostgreSQL server, inside the test's transaction
(NOTIFY, which needs commits, runs on raw connections at the end). Every
failure is checked by SQLSTATE and HINT, and against what soniq_enqueue
says for the same input.
"""

import datetime as dt
import json
import uuid

import pytest
from django.db import connection, transaction
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from soniq_django import args_hash
from soniq_django.models import Job

from tests.support.sql import (
    FLOAT64_OVERFLOW, fails, fetch, job_count, nested, quote_ident, raw, value,
)

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db]

PARAMETERS = ("job_name", "args", "queue", "priority", "run_at", "max_attempts", "unique_job",
              "dedup_key", "producer_id", "job_id")


def many(jobs) -> list[uuid.UUID]:
    """soniq_enqueue_many of ``jobs`` (JSON text, or a value to encode)."""
    text = jobs if isinstance(jobs, str) else json.dumps(jobs)
    return value("SELECT soniq_enqueue_many(%s::jsonb)", [text])


def many_fails(jobs):
    text = jobs if isinstance(jobs, str) or jobs is None else json.dumps(jobs)
    return fails("SELECT soniq_enqueue_many(%s::jsonb)", [text])


def one(job: dict) -> uuid.UUID:
    """soniq_enqueue with the same job, each key a named parameter."""
    values = [json.dumps(v) if name == "args" else v for name, v in job.items()]
    casts = {"args": "::jsonb", "run_at": "::timestamptz", "job_id": "::uuid"}
    named = ", ".join(f"{name} => %s{casts.get(name, '')}" for name in job)
    return value(f"SELECT soniq_enqueue({named})", values)


def one_fails(job: dict):
    casts = {"args": "::jsonb", "run_at": "::timestamptz", "job_id": "::uuid"}
    named = ", ".join(f"{name} => %s{casts.get(name, '')}" for name in job)
    values = [json.dumps(v) if name == "args" else v for name, v in job.items()]
    return fails(f"SELECT soniq_enqueue({named})", values)


def state(error):
    return error.sqlstate, error.diag.message_hint


VALID = {"job_name": "billing.send_invoice", "args": {"order_id": 1}}


# --------------------------------------------------------------------------
# Every rule: SQLSTATE, HINT, message, position; nothing written


BAD_JOBS = [
    # (bad element, SQLSTATE, HINT, words the message holds)
    ({"job_name": "Bad Name"}, "22023", "SONIQ_INVALID_TASK_NAME", "task-name pattern"),
    ({"job_name": None}, "22023", "SONIQ_INVALID_TASK_NAME", "task-name pattern"),
    ({"args": {}}, "22023", "SONIQ_INVALID_TASK_NAME", "task-name pattern"),  # no job_name
    ({"job_name": "a.b", "args": []}, "22023", "SONIQ_TASK_ARGS_INVALID", "JSON object"),
    ({"job_name": "a.b", "args": "x"}, "22023", "SONIQ_TASK_ARGS_INVALID", "JSON object"),
    ({"job_name": "a.b", "args": None}, "22023", "SONIQ_TASK_ARGS_INVALID", "JSON object"),
    ({"job_name": "a.b", "args": {"n": "NUMBER"}}, "22023", "SONIQ_TASK_ARGS_INVALID",
     "64-bit float"),
    ({"job_name": "a.b", "args": "NESTED"}, "22023", "SONIQ_TASK_ARGS_INVALID", "500"),
    ({"job_name": "a.b", "max_attempts": 0}, "22023", "SONIQ_INVALID_MAX_ATTEMPTS", "at least 1"),
    ({"job_name": "a.b", "max_attempts": -5}, "22023", "SONIQ_INVALID_MAX_ATTEMPTS", "at least 1"),
    ({"job_name": "a.b", "queue": ""}, "22023", "SONIQ_INVALID_OPTION", "queue"),
    ({"job_name": "a.b", "queue": "q" * 256}, "22023", "SONIQ_INVALID_OPTION", "queue"),
    ({"job_name": "a.b", "dedup_key": ""}, "22023", "SONIQ_INVALID_OPTION", "dedup_key"),
    ({"job_name": "a.b", "dedup_key": "é" * 256}, "22023", "SONIQ_INVALID_OPTION", "dedup_key"),
    ({"job_name": "a.b", "producer_id": ""}, "22023", "SONIQ_INVALID_OPTION", "producer_id"),
    ({"job_name": "a.b", "producer_id": "p" * 256}, "22023", "SONIQ_INVALID_OPTION",
     "producer_id"),
]


def _materialize(job: dict) -> dict:
    job = dict(job)
    if job.get("args") == {"n": "NUMBER"}:
        job["args"] = {"n": FLOAT64_OVERFLOW}
    if job.get("args") == "NESTED":
        job["args"] = json.loads(nested(500, "mixed"))
    return job


def _text(jobs) -> str:
    # json.dumps writes FLOAT64_OVERFLOW as its exact digits.
    return json.dumps(jobs)


@pytest.mark.parametrize(("bad", "sqlstate", "hint", "words"), BAD_JOBS)
def test_each_rule_fails_the_whole_call_with_soniq_enqueues_code(bad, sqlstate, hint, words):
    bad = _materialize(bad)
    error = many_fails(_text([VALID, bad, VALID]))
    assert state(error) == (sqlstate, hint)
    assert words in error.diag.message_primary
    assert error.diag.message_detail == "jobs element 2 (counting from 1)"
    assert job_count() == 0  # the valid first element was not written either
    # soniq_enqueue refuses the same job with the same code and message.
    if "job_name" in bad:
        single = one_fails({"args": {}, **bad})
        assert (state(single), single.diag.message_primary) == (
            (sqlstate, hint), error.diag.message_primary)


@pytest.mark.parametrize(
    ("jobs", "words"),
    [("{}", "JSON array"), ('"x"', "JSON array"), ("null", "JSON array"), (None, "JSON array"),
     ([VALID, 1], "JSON object"), ([VALID, []], "JSON object"), ([VALID, None], "JSON object"),
     ([VALID, {**VALID, "unique": True}], "not a soniq_enqueue parameter"),
     ([VALID, {**VALID, "Queue": "q"}], "not a soniq_enqueue parameter")],
)
def test_the_shape_of_the_batch_is_checked(jobs, words):
    error = many_fails(jobs)
    assert state(error) == ("22023", "SONIQ_INVALID_OPTION")
    assert words in error.diag.message_primary
    assert job_count() == 0


@pytest.mark.parametrize(
    ("option", "bad", "sqlstate"),
    [("priority", "x", "22P02"), ("priority", 1.5, "22P02"), ("priority", 2**31, "22003"),
     ("max_attempts", "many", "22P02"), ("run_at", "tomorrow-ish", "22007"),
     ("run_at", "2024-13-45T00:00:00Z", "22008"), ("unique_job", "perhaps", "22P02"),
     ("job_id", "not-a-uuid", "22P02")],
)
def test_a_value_that_does_not_convert_fails_as_the_cast_does(option, bad, sqlstate):
    error = many_fails([VALID, {**VALID, option: bad}])
    assert error.sqlstate == sqlstate
    assert job_count() == 0


def test_the_first_invalid_element_in_array_order_decides():
    bad_name, bad_args = {"job_name": "Bad"}, {"job_name": "a.b", "args": []}
    first = many_fails([VALID, bad_name, bad_args])
    assert (first.diag.message_hint, first.diag.message_detail) == (
        "SONIQ_INVALID_TASK_NAME", "jobs element 2 (counting from 1)")
    second = many_fails([VALID, bad_args, bad_name])
    assert (second.diag.message_hint, second.diag.message_detail) == (
        "SONIQ_TASK_ARGS_INVALID", "jobs element 2 (counting from 1)")
    # A conversion error counts where it stands, too.
    third = many_fails([bad_name, {**VALID, "priority": "x"}])
    assert third.diag.message_hint == "SONIQ_INVALID_TASK_NAME"


# Within one element, the rule soniq_enqueue checks first is the one reported.
COMBINED = st.fixed_dictionaries({}, optional={
    "job_name": st.sampled_from(["Bad Name", "a.b"]),
    "args": st.sampled_from([[], {"n": 1}, {"n": FLOAT64_OVERFLOW}]),
    "max_attempts": st.sampled_from([0, 3, None]),
    "queue": st.sampled_from(["", "q"]),
    "dedup_key": st.sampled_from(["", "k" * 256]),
    "producer_id": st.sampled_from(["", "p"]),
})


def _outcome(call):
    """("ok",) or the error's SQLSTATE, HINT and message; nothing the call wrote is kept."""
    sid = transaction.savepoint()
    try:
        call()
        return ("ok",)
    except AssertionError:  # fails() found that the call succeeded
        return ("ok",)
    finally:
        transaction.savepoint_rollback(sid)


def _error_outcome(error):
    return (error.sqlstate, error.diag.message_hint, error.diag.message_primary)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(job=COMBINED)
def test_the_rule_order_is_soniq_enqueues(job):
    job = {"job_name": "a.b", **job}
    found = []
    for call in (lambda: one_fails(job), lambda: many_fails([job])):
        box = []
        outcome = _outcome(lambda: box.append(_error_outcome(call())))
        found.append(box[0] if box else outcome)
    assert found[0] == found[1]


def _alter_database(clause):
    database = quote_ident(connection.settings_dict["NAME"])
    fetch(f"ALTER DATABASE {database} {clause}")  # rolled back with the test


def test_the_database_pattern_applies_and_a_callers_setting_does_not():
    _alter_database("SET soniq.task_name_pattern = '^[A-Z]+$'")
    fetch("SET LOCAL soniq.task_name_pattern = '^.+$'")
    assert len(many([{"job_name": "UPPER"}])) == 1
    assert state(many_fails([{"job_name": "billing.send_invoice"}])) == (
        "22023", "SONIQ_INVALID_TASK_NAME")
    assert state(one_fails({"job_name": "billing.send_invoice"})) == (
        "22023", "SONIQ_INVALID_TASK_NAME")
    _alter_database("RESET soniq.task_name_pattern")
    assert state(many_fails([{"job_name": "UPPER"}])) == ("22023", "SONIQ_INVALID_TASK_NAME")


def test_the_catalog_path_v2_reads_the_database_oid_from_names_this_database():
    assert value(
        "SELECT substring(pg_relation_filepath('pg_catalog.pg_proc'::regclass), "
        "'([0-9]+)/[0-9]+$')::oid = (SELECT oid FROM pg_database "
        "WHERE datname = current_database())") is True


# --------------------------------------------------------------------------
# What gets written


def test_ids_come_back_in_array_order_and_defaults_are_soniq_enqueues():
    fetch("SET LOCAL application_name = 'batch-producer'")
    wanted = uuid.uuid4()
    ids = many([{"job_name": "a.one"},
                {"job_name": "a.two", "args": {"n": 2}, "queue": "q", "priority": 5,
                 "max_attempts": None, "producer_id": "p", "job_id": str(wanted)},
                {"job_name": "a.three", "max_attempts": 9}])
    assert len(ids) == 3 and ids[1] == wanted
    rows = {job.id: job for job in Job.objects.all()}
    first, second, third = (rows[i] for i in ids)
    assert (first.job_name, first.args, first.queue, first.priority, first.max_attempts) == (
        "a.one", {}, "default", 100, 4)
    assert (first.unique_job, first.dedup_key, first.args_hash, first.scheduled_at) == (
        False, None, None, None)
    assert first.producer_id == third.producer_id == "batch-producer"
    assert (second.queue, second.priority, second.max_attempts, second.producer_id) == (
        "q", 5, None, "p")
    assert third.max_attempts == 9
    assert all(i.version == 4 for i in ids)


def test_an_empty_array_writes_nothing():
    assert many([]) == []
    assert job_count() == 0


def test_unique_and_dedup_jobs_within_one_batch():
    ids = many([
        {"job_name": "r.build", "args": {"day": "d", "n": [1, 2]}, "unique_job": True},
        {"job_name": "r.plain", "args": {"day": "d"}},
        {"job_name": "r.build", "args": {"n": [1, 2], "day": "d"}, "unique_job": True,
         "queue": "elsewhere"},
        {"job_name": "m.send", "dedup_key": "k1"},
        {"job_name": "m.other", "dedup_key": "k1", "queue": "mail"},
        {"job_name": "r.plain", "args": {"day": "d"}},
    ])
    assert ids[0] == ids[2] and ids[3] == ids[4]
    assert len(set(ids)) == 4 and job_count() == 4
    unique = Job.objects.get(id=ids[0])
    assert (unique.queue, unique.args_hash) == ("default", args_hash({"day": "d", "n": [1, 2]}))
    assert Job.objects.get(id=ids[3]).job_name == "m.send"


def test_unique_and_dedup_jobs_against_rows_already_queued():
    unique = value("SELECT soniq_enqueue('r.build', '{\"day\": \"d\"}', unique_job => true)")
    keyed = value("SELECT soniq_enqueue('m.send', '{}', dedup_key => 'k1')")
    done = value("SELECT soniq_enqueue('m.done', '{}', dedup_key => 'k2')")
    Job.objects.filter(id=done).update(status="done")
    ids = many([{"job_name": "r.build", "args": {"day": "d"}, "unique_job": True,
                 "job_id": str(uuid.uuid4())},
                {"job_name": "m.again", "dedup_key": "k1"},
                {"job_name": "m.done", "dedup_key": "k2"}])
    assert ids[:2] == [unique, keyed]
    assert ids[2] != done and Job.objects.get(id=ids[2]).status == "queued"
    assert job_count() == 4


@pytest.mark.parametrize("where", ["existing", "same batch", "same batch, unique"])
def test_a_repeated_job_id_is_23505_and_writes_nothing(where):
    taken = uuid.uuid4()
    if where == "existing":
        value("SELECT soniq_enqueue('a.b', '{}', job_id => %s)", [taken])
        jobs = [VALID, {**VALID, "job_id": str(taken)}]
    elif where == "same batch":
        jobs = [{**VALID, "job_id": str(taken)}, {**VALID, "job_id": str(taken)}]
    else:
        jobs = [{**VALID, "job_id": str(taken)},
                {**VALID, "job_id": str(taken), "unique_job": True}]
    before = job_count()
    error = many_fails(jobs)
    assert (error.sqlstate, error.diag.constraint_name) == ("23505", "soniq_jobs_pkey")
    assert job_count() == before


# --------------------------------------------------------------------------
# Same rows as soniq_enqueue, for generated input

NAMES = st.sampled_from(["a.b", "billing.send_invoice", "r.x"])
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=6)
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.text(max_size=4), children, max_size=3),
    max_leaves=8,
)
RUN_AT = st.sampled_from([
    "2020-01-01T00:00:00+00:00", "2999-01-01T12:30:00.123456+02:00", "2024-05-01 09:00:00Z"])
JOB = st.fixed_dictionaries({"job_name": NAMES}, optional={
    "args": st.dictionaries(st.sampled_from(["a", "b", "é", "k"]), JSON_VALUES, max_size=3),
    "queue": st.sampled_from(["default", "mail", "é" * 255]) | st.none(),
    "priority": st.integers(-(2**31), 2**31 - 1) | st.none(),
    "run_at": RUN_AT | st.none(),
    "max_attempts": st.integers(1, 2**31 - 1) | st.none(),
    "unique_job": st.booleans() | st.none(),
    "dedup_key": st.sampled_from(["k1", "k2"]) | st.none(),
    "producer_id": st.sampled_from(["p1", "😀" * 3]) | st.none(),
    "job_id": st.sampled_from(["5b1b2a1c-1111-4d2d-8e3e-000000000001",
                               "5b1b2a1c-1111-4d2d-8e3e-000000000002"]) | st.none(),
})
COLUMNS = ("job_name", "args", "args_hash", "status", "attempts", "max_attempts", "queue",
           "priority", "unique_job", "dedup_key", "scheduled_at", "producer_id", "expires_at",
           "result", "last_error", "worker_id")


def _written(ids) -> list:
    """The rows behind ``ids``, as comparable tuples, and which positions share a job."""
    rows = fetch(f"SELECT id, {', '.join(COLUMNS)} FROM soniq_jobs")
    by_id = {row[0]: row[1:] for row in rows}
    first_position = {}
    shape = [first_position.setdefault(i, n) for n, i in enumerate(ids)]
    return [by_id[i] for i in ids], shape, len(rows)


def _given_ids(jobs, ids):
    """Which positions got the job_id they asked for (a duplicate ignores it)."""
    return [str(i) == job.get("job_id") for job, i in zip(jobs, ids)]


@settings(max_examples=80, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(jobs=st.lists(JOB, max_size=6))
@example(jobs=[  # a taken id, then NUL args: the orders of the two refusals differ
    {"job_name": "a.b", "job_id": "5b1b2a1c-1111-4d2d-8e3e-000000000001"},
    {"job_name": "a.b", "job_id": "5b1b2a1c-1111-4d2d-8e3e-000000000001"},
    {"job_name": "a.b", "args": {"a": "\x00"}},
])
def test_enqueue_many_writes_what_soniq_enqueue_writes(jobs):
    fetch("SET LOCAL application_name = 'hypothesis'")
    outcomes = []
    for call in ("one by one", "many"):
        sid = transaction.savepoint()
        try:
            with transaction.atomic():
                if call == "many":
                    ids = many(jobs)
                else:
                    ids = [one(job) for job in jobs]
                outcomes.append(("ok", _written(ids), _given_ids(jobs, ids)))
        except Exception as exc:  # both must fail alike
            error = getattr(exc, "__cause__", None) or exc
            outcomes.append(("error", getattr(error, "sqlstate", repr(exc))))
        finally:
            transaction.savepoint_rollback(sid)
    if any("\\u0000" in json.dumps(job.get("args")) for job in jobs):
        # jsonb cannot hold NUL: the batch's args fail to convert (22P05)
        # before any row is looked at, where one by one the first failing
        # job -- perhaps a taken id, 23505 -- stops the loop first.
        assert outcomes[1] == ("error", "22P05") and outcomes[0][0] == "error"
        return
    assert outcomes[0] == outcomes[1]


# --------------------------------------------------------------------------
# The length bound below which v2 skips the nesting and number scans


def _args_text_length(args_text: str) -> int:
    return value("SELECT octet_length(%s::jsonb::text)", [args_text])


@pytest.mark.parametrize("sign", ["", "-"])
def test_the_shortest_args_that_the_number_scan_refuses_are_at_the_bound(sign):
    # {"": N} is the shortest object holding N; FLOAT64_OVERFLOW is the
    # smallest magnitude refused, and jsonb writes it with all 309 digits.
    shortest = '{"": %s%d}' % (sign, FLOAT64_OVERFLOW)
    assert _args_text_length(shortest) == 315 + len(sign)
    error = fails("SELECT soniq_enqueue('a.b', %s::jsonb)", [shortest])
    assert state(error) == ("22023", "SONIQ_TASK_ARGS_INVALID")
    error = many_fails('[{"job_name": "a.b", "args": %s}]' % shortest)
    assert state(error) == ("22023", "SONIQ_TASK_ARGS_INVALID")
    # Any shorter way to write a refused magnitude prints at least as long.
    for literal in ("1.8e308", "2e308", "1e400"):
        assert _args_text_length('{"": %s}' % literal) >= 315
    # One less is a float, and at the same length it passes the scan that ran.
    below = '{"": %s%d}' % (sign, FLOAT64_OVERFLOW - 1)
    assert _args_text_length(below) == 315 + len(sign)
    assert value("SELECT soniq_enqueue('a.b', %s::jsonb)", [below])
    assert many('[{"job_name": "a.b", "args": %s}]' % below)


def test_the_shortest_args_that_the_nesting_scan_refuses_are_far_above_the_bound():
    shortest = nested(500, "array")
    assert _args_text_length(shortest) >= 1000 > 315
    for call in (lambda: fails("SELECT soniq_enqueue('a.b', %s::jsonb)", [shortest]),
                 lambda: many_fails('[{"job_name": "a.b", "args": %s}]' % shortest)):
        assert state(call()) == ("22023", "SONIQ_TASK_ARGS_INVALID")


# --------------------------------------------------------------------------
# Wake-ups: one NOTIFY per queue with a job due now, at commit


@pytest.mark.usefixtures("committed_db")
def test_one_notification_per_queue_that_got_a_due_job():
    later = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    with raw() as listener, raw() as producer:
        listener.execute("LISTEN soniq_new_job")
        keyed = producer.execute(
            "SELECT soniq_enqueue('m.k', '{}', queue => 'dup', dedup_key => 'kk')").fetchone()[0]
        assert [n.payload for n in listener.notifies(timeout=5, stop_after=1)] == ["dup"]
        ids = producer.execute("SELECT soniq_enqueue_many(%s::jsonb)", [json.dumps([
            {"job_name": "a.b", "queue": "a"}, {"job_name": "a.b", "queue": "a"},
            {"job_name": "a.b", "queue": "b"}, {"job_name": "a.b", "queue": "later",
                                                "run_at": later},
            {"job_name": "a.u", "queue": "u", "unique_job": True},
            {"job_name": "a.u", "queue": "u", "unique_job": True},
            {"job_name": "a.k", "queue": "dup", "dedup_key": "kk"},
        ])]).fetchone()[0]
        assert ids[-1] == keyed
        got = [n.payload for n in listener.notifies(timeout=5, stop_after=3)]
        got += [n.payload for n in listener.notifies(timeout=0.5)]
    assert sorted(got) == ["a", "b", "u"]
