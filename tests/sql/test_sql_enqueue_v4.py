"""Producer API v4's soniq_enqueue gives version 3's outcome for every input (decision 0027).

Version 4 checks, inserts and notifies a plain job by one statement and
sends every other call through version 3's body. Version 3's body, read from
the released producer_api_v3.sql itself, is installed here as a pg_temp
function; each hypothesis example sets up one state in a transaction (a
database-level pattern or none, a queued dedup job, a queued unique job, a
live and a dead-lettered job id), makes the same call through both (a
savepoint rolled back between them) and requires the same outcome: the same
row written (or the same existing job's id returned), or the same SQLSTATE,
HINT, message and constraint. PostgreSQL only: SQLite has no SQL functions.
"""

import uuid

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from tests.sql.test_sql_batch_write_cost import install_reference
from tests.support.sql import FLOAT64_OVERFLOW, nested, quote_ident, raw

pytestmark = [pytest.mark.version_independent,  # SQL only: run in the Django 5.2 passes
              pytest.mark.postgresql_only, pytest.mark.django_db,
              pytest.mark.usefixtures("committed_db")]

LIVE_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")
DEAD_ID = uuid.UUID("00000000-0000-4000-8000-000000000002")
FRESH_ID = uuid.UUID("00000000-0000-4000-8000-000000000003")

#: Where the task-name pattern might be set: only the database-level one counts.
PATTERNS = (
    None,
    ("database", "^[A-Z]+$"),
    ("database", "^.+$"),
    ("database", "("),  # not a regular expression: 2201B from both, for a non-NULL name
    ("database_after_another", "^[a-z.]+$"),
    ("database_similar_name", "^.+$"),
    ("role_in_database", "^.+$"),
    ("session", "^.+$"),
)

#: soniq_enqueue's parameters after job_name and args, in order.
OPTIONS = ("queue", "priority", "run_at", "max_attempts", "unique_job", "dedup_key",
           "producer_id", "job_id")


def filler(size: int) -> str:
    """JSON text of an args object whose jsonb text is exactly ``size`` bytes (size >= 9)."""
    return '{"s": "' + "x" * (size - 9) + '"}'


def mostly(valid, invalid):
    """``valid`` three times in four: most examples then reach the INSERT."""
    return st.one_of(valid, valid, valid, invalid)


job_names = mostly(
    st.sampled_from(["a", "a.b", "billing.send_invoice", "x_1.y_2", "UPPER"]),
    st.one_of(st.sampled_from([None, "", "A", "1a", "a..b", "a.", "a-b", "é", "a" * 300,
                               "Anything Goes-1"]),
              st.text(alphabet="abAB._-1 é", max_size=12)),
)
args = mostly(
    st.one_of(st.sampled_from(["{}", '{"n": 1}', '{"a": [1, {"b": null}]}', filler(314),
                               # 307 bytes of text, 1224 as jsonb: version 3's path
                               '{"a": [' + ",".join(["1"] * 100) + "]}"]),
              st.integers(9, 314).map(filler)),
    st.one_of(st.sampled_from([None, "[]", "1", '"s"', "null", filler(315), filler(316),
                               nested(499), nested(500), nested(500, "array"),
                               '{"n": ' + str(FLOAT64_OVERFLOW) + "}",
                               '{"n": ' + str(FLOAT64_OVERFLOW - 2**969) + "}"]),
              st.integers(315, 400).map(filler)),
)
options = st.fixed_dictionaries({}, optional={
    "queue": mostly(st.sampled_from(["default", "other", "q" * 255, "é" * 255]),
                    st.sampled_from([None, "", "q" * 256, "é" * 256])),
    "priority": st.sampled_from([None, -5, 0, 7, 100, 2**31 - 1]),
    "run_at": st.sampled_from([None, "-1 minute", "+1 hour"]),
    "max_attempts": mostly(st.sampled_from([1, 4, 25]), st.sampled_from([None, -1, 0])),
    "unique_job": st.sampled_from([None, False, False, True]),
    "dedup_key": st.sampled_from([None, None, None, "", "k1", "k2", "k" * 255, "k" * 256]),
    "producer_id": mostly(st.sampled_from([None, "p", "p" * 255]),
                          st.sampled_from(["", "p" * 256])),
    "job_id": st.sampled_from([None, None, None, LIVE_ID, DEAD_ID, FRESH_ID]),
})


@pytest.fixture
def conn():
    with raw(autocommit=False) as connection:
        install_reference(connection, "producer_api_v3.sql", "soniq_enqueue", "v3_enqueue")
        connection.commit()
        yield connection
        connection.rollback()


def set_pattern(conn, where):
    if where is None:
        return
    kind, pattern = where
    (database,) = conn.execute("SELECT current_database()").fetchone()
    db = quote_ident(database)
    literal = "'" + pattern.replace("'", "''") + "'"
    # Rolled back with the example's transaction, as every change here.
    if kind == "database":
        conn.execute(f"ALTER DATABASE {db} SET soniq.task_name_pattern = {literal}")
    elif kind == "database_after_another":
        conn.execute(f"ALTER DATABASE {db} SET soniq.an_earlier_setting = 'x'")
        conn.execute(f"ALTER DATABASE {db} SET soniq.task_name_pattern = {literal}")
    elif kind == "database_similar_name":
        conn.execute(f"ALTER DATABASE {db} SET soniq.task_name_pattern_extra = {literal}")
    elif kind == "role_in_database":
        conn.execute(f"ALTER ROLE CURRENT_USER IN DATABASE {db} "
                     f"SET soniq.task_name_pattern = {literal}")
    else:
        conn.execute(f"SET LOCAL soniq.task_name_pattern = {literal}")


def set_up(conn):
    """The jobs a call can collide with."""
    conn.execute("INSERT INTO soniq_jobs (id, job_name, args, status, queue) "
                 "VALUES (%s, 'live.job', '{}', 'processing', 'default')", [LIVE_ID])
    conn.execute("INSERT INTO soniq_dead_letter_jobs (id, job_name, dead_letter_reason) "
                 "VALUES (%s, 'dead.job', 'permanent_failure')", [DEAD_ID])
    conn.execute("INSERT INTO soniq_jobs (id, job_name, args, status, dedup_key) "
                 "VALUES (gen_random_uuid(), 'dedup.job', '{}', 'queued', 'k1')")
    conn.execute("SELECT soniq_enqueue('a.b', '{\"n\": 1}', unique_job => true)")
    conn.execute("SELECT soniq_enqueue('billing.send_invoice', '{}', unique_job => true, "
                 "dedup_key => 'k2')")


def snapshot(conn):
    return conn.execute(
        "SELECT id, job_name, args::text, args_hash, status, attempts, max_attempts, queue,"
        " priority, unique_job, dedup_key, scheduled_at - now(), producer_id"
        " FROM soniq_jobs ORDER BY created_at, id").fetchall()


def call(conn, function, job_name, job_args, chosen):
    sql = f"SELECT {function}(%s, %s::jsonb"
    params = [job_name, job_args]
    for name in OPTIONS:
        if name not in chosen:
            continue
        value = chosen[name]
        if name == "run_at" and value is not None:
            sql += f", run_at => now() + %s::interval"
        else:
            sql += f", {name} => %s"
        params.append(value)
    before = {row[0] for row in snapshot(conn)}
    conn.execute("SAVEPOINT one_call")
    try:
        (returned,) = conn.execute(sql + ")", params).fetchone()
    except Exception as exc:  # psycopg.Error: compared below
        conn.execute("ROLLBACK TO SAVEPOINT one_call")
        diag = exc.diag
        return ("error", exc.sqlstate, diag.message_hint, diag.message_primary,
                diag.constraint_name)
    after = snapshot(conn)
    conn.execute("ROLLBACK TO SAVEPOINT one_call")
    new = [row[1:] for row in after if row[0] not in before]
    # A generated id differs from call to call; a requested or existing one must not.
    shown = returned if returned in before or returned in (LIVE_ID, DEAD_ID, FRESH_ID) else "new"
    return ("ok", shown, new, len(after) - len(before))


@settings(max_examples=500, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.one_of(st.none(), st.sampled_from(PATTERNS)), job_names, args, options)
def test_version_4_gives_version_3s_outcome(conn, pattern, job_name, job_args, chosen):
    set_up(conn)
    set_pattern(conn, pattern)
    v4 = call(conn, "soniq_enqueue", job_name, job_args, chosen)
    v3 = call(conn, "pg_temp.v3_enqueue", job_name, job_args, chosen)
    conn.rollback()
    assert v4 == v3


def nested_statements(conn, sql, params=()):
    """The statements (auto_explain, at NOTICE) that ``sql`` runs inside its functions."""
    notices = []
    conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
    for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                    "SET auto_explain.log_nested_statements = on",
                    "SET auto_explain.log_level = notice"):
        conn.execute(setting)
    conn.execute(sql, params)
    conn.execute("SET auto_explain.log_min_duration = -1")
    return [n for n in notices if n.startswith("duration:")][:-1]  # the last is ``sql`` itself


def test_a_plain_job_takes_two_statements_and_another_one_takes_version_3s_path(conn):
    for _ in range(7):  # past the custom plans of the first five calls
        plain = nested_statements(conn, "SELECT soniq_enqueue('fast.path', '{\"n\": 1}')")
        # The database's settings row, then one INSERT (that also notifies); version 3
        # ran three: the pattern, the INSERT and a PERFORM of pg_notify.
        assert len(plain) == 2, plain
        assert "pg_db_role_setting" in plain[0] and "unnest" not in plain[0], plain[0]
        assert "Insert on soniq_jobs" in plain[1] and "pg_notify" in plain[1], plain[1]
    dedup = nested_statements(conn, "SELECT soniq_enqueue('slow.path', dedup_key => 'd')")
    # The settings row, then version 3's path: the dead-letter check on job_id (an
    # EXISTS), its INSERT ... ON CONFLICT and its NOTIFY.
    assert len(dedup) == 4, dedup
    assert "soniq_dead_letter_jobs" in dedup[1], dedup[1]
    assert "Conflict Resolution" in dedup[2] and "pg_notify" in dedup[3], dedup
    conn.rollback()


def test_the_plain_call_wakes_workers_only_for_a_job_due_now(conn):
    conn.execute("LISTEN soniq_new_job")
    conn.commit()
    ids = [conn.execute(sql).fetchone()[0] for sql in (
        "SELECT soniq_enqueue('fast.now', queue => 'n1')",
        "SELECT soniq_enqueue('fast.due', queue => 'n2', run_at => now() - interval '1 s')",
        "SELECT soniq_enqueue('fast.later', queue => 'n3', run_at => now() + interval '1 h')",
    )]
    conn.commit()
    woken = sorted(n.payload for n in conn.notifies(timeout=1, stop_after=2))
    assert woken == ["n1", "n2"]
    assert list(conn.notifies(timeout=0.2)) == []
    assert conn.execute("SELECT count(*) FROM soniq_jobs WHERE id = ANY(%s)",
                        [ids]).fetchone() == (3,)
