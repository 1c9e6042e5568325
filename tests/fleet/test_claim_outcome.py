"""soniq_claim_outcome: after a write whose answer was lost, what became of the claim.

Each outcome from a real sequence of protocol calls; the nonce is compared,
never returned; a transaction of the same claim still committing is waited
for; and the worker's own transaction (its effect, then soniq_complete, then
COMMIT) is settled exactly: a COMMIT that landed reads ``completed`` with the
effect there, one that never ran reads ``live`` with no effect. Validation
of the registration's input is a property test. PostgreSQL: the SQL API.
"""

import threading
import time
import uuid

import psycopg
import pytest
from hypothesis import given, settings as hsettings, strategies as st

from soniq_django import enqueue
from tests.support.sql import conninfo, fetch, raw, raw_fails

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]

W = "worker-o"


def claim(nonce: str, lease: float = 30) -> list:
    row = fetch("SELECT job_id::text, generation FROM soniq_claim(%s, %s, ARRAY['o'], %s)",
                [W, nonce, lease])[0]
    return [row[0], W, row[1], nonce]


def outcome(fence: list) -> tuple:
    return tuple(fetch("SELECT * FROM soniq_claim_outcome(%s, %s, %s, %s)", fence[:4])[0])


def call(function: str, fence: list, *extra) -> bool:
    marks = ", ".join(["%s"] * (5 + len(extra)))
    return fetch(f"SELECT {function}({marks})", [*fence, "o", *extra])[0][0]


def test_each_ending_of_a_claim_reads_as_its_outcome():
    job = enqueue("fleet.o", {}, queue="o")
    fence = claim("n-1")
    assert outcome(fence) == ("live", "processing", 1)
    wrong = fence[:3] + ["n-guess"]
    assert outcome(wrong) == ("unknown", "processing", 1)  # the nonce is the proof
    assert call("soniq_fail", fence, "boom", True, 0)
    assert outcome(fence) == ("failed", "queued", 1)
    fence = claim("n-2")
    assert call("soniq_defer", fence, "not here", 0)
    assert outcome(fence) == ("deferred", "queued", 2)
    fence = claim("n-3")
    assert call("soniq_complete", fence, '{"r": 1}')
    assert outcome(fence) == ("completed", "done", 3)
    assert outcome(fence[:3] + ["n-guess"]) == ("unknown", "done", 3)
    # Generation 1's row was claimed again since: its nonce is gone from the row,
    # and the attempt history tells how that claim of this worker ended.
    assert outcome(wrong) == ("failed", "done", 3)
    assert str(job) == fence[0]


def test_a_lapse_a_cancel_and_a_dead_letter():
    enqueue("fleet.o", {}, queue="o", max_attempts=1)
    fence = claim("n-1", lease=0.2)
    time.sleep(0.3)
    assert outcome(fence) == ("lapsed", "processing", 1)
    fetch("SELECT count(*) FROM soniq_claim('other', 'n-x', ARRAY['none'])")  # reaps it
    assert outcome(fence) == ("dead", "dead_letter", None)

    enqueue("fleet.o", {}, queue="o")
    fence = claim("n-2")
    fetch("SELECT soniq_request_cancel(%s::uuid)", [fence[0]])
    assert call("soniq_acknowledge_cancel", fence)
    assert outcome(fence) == ("cancelled", "cancelled", 1)


def test_a_commit_still_in_flight_is_waited_for():
    enqueue("fleet.o", {}, queue="o")
    fence = claim("n-1")
    with raw(autocommit=False) as worker:
        assert worker.execute("SELECT soniq_complete(%s, %s, %s, %s, 'o')",
                              fence).fetchone() == (True,)
        answers = []
        asker = threading.Thread(target=lambda: answers.append(outcome(fence)))
        asker.start()
        time.sleep(0.3)
        assert answers == [] and asker.is_alive()  # waits on the row the write locked
        worker.commit()
        asker.join(10)
    assert answers == [("completed", "done", 1)]


def test_the_workers_own_transaction_is_settled_exactly():
    with raw() as admin:
        admin.execute("CREATE TABLE fleet_o_effects (job_id uuid)")
    try:
        enqueue("fleet.o", {}, queue="o")
        fence = claim("n-1")
        # 1. The connection dies before COMMIT: rolled back, the claim is still live.
        doomed = psycopg.connect(autocommit=False, **conninfo())
        doomed.execute("INSERT INTO fleet_o_effects VALUES (%s)", [fence[0]])
        doomed.execute("SELECT soniq_complete(%s, %s, %s, %s, 'o')", fence)
        pid = doomed.info.backend_pid
        fetch("SELECT pg_terminate_backend(%s)", [pid])
        with pytest.raises(psycopg.OperationalError):
            doomed.commit()
        doomed.close()
        assert outcome(fence) == ("live", "processing", 1)
        assert fetch("SELECT count(*) FROM fleet_o_effects") == [(0,)]
        # 2. Run the transaction again; its COMMIT lands (whatever became of its answer).
        with raw(autocommit=False) as again:
            again.execute("INSERT INTO fleet_o_effects VALUES (%s)", [fence[0]])
            again.execute("SELECT soniq_complete(%s, %s, %s, %s, 'o')", fence)
            again.commit()
        assert outcome(fence) == ("completed", "done", 1)
        assert fetch("SELECT count(*) FROM fleet_o_effects") == [(1,)]
    finally:
        with raw() as admin:
            admin.execute("DROP TABLE fleet_o_effects")


def test_bad_fences_are_refused_with_22023():
    with raw() as conn:
        for sql in ("SELECT * FROM soniq_claim_outcome(gen_random_uuid()::text, '', 1, 't')",
                    "SELECT * FROM soniq_claim_outcome(gen_random_uuid()::text, 'w', 0, 't')",
                    "SELECT * FROM soniq_claim_outcome(NULL, 'w', 1, 't')"):
            error = raw_fails(conn, sql)
            assert (error.sqlstate, error.diag.message_hint) == ("22023", "CONFIG"), sql


_names = st.lists(st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
                          min_size=0, max_size=1002), max_size=4)


@hsettings(max_examples=60, deadline=None)
@given(names=_names, limits=st.one_of(st.none(), st.lists(
    st.one_of(st.none(), st.integers(-2, 5)), max_size=4)),
    queues=st.lists(st.one_of(st.text(st.characters(codec="utf-8", exclude_characters="\x00"),
                                      min_size=0, max_size=3), st.just("q" * 256)), max_size=3))
def test_a_registration_is_taken_whole_or_refused_with_22023(names, limits, queues):
    valid = (all(1 <= len(n) <= 1000 for n in names) and len(set(names)) == len(names)
             and all(1 <= len(q) <= 255 for q in queues)
             and (limits is None or (len(limits) == len(names)
                                     and all(m is None or m >= 1 for m in limits))))
    worker = str(uuid.uuid4())
    with raw() as conn:
        sql = ("SELECT soniq_register_worker(%s, %s::text[], %s::text[], 'h', 7, NULL, "
               "%s::integer[])")
        if valid:
            conn.execute(sql, [worker, queues, names, limits])
            stored = dict(conn.execute(
                "SELECT task_name, max_attempts FROM soniq_task_registry WHERE worker_id = %s",
                [worker]).fetchall())
            assert stored == dict(zip(names, limits or [None] * len(names)))
        else:
            error = raw_fails(conn, sql, [worker, queues, names, limits])
            assert (error.sqlstate, error.diag.message_hint) == ("22023", "CONFIG")
            assert conn.execute("SELECT count(*) FROM soniq_workers WHERE id = %s",
                                [worker]).fetchone() == (0,)
        conn.execute("DELETE FROM soniq_task_registry WHERE worker_id = %s", [worker])
        conn.execute("DELETE FROM soniq_workers WHERE id = %s", [worker])


def test_a_worker_id_that_is_not_a_uuid_is_refused_by_the_cast_before_anything_is_written():
    # docs/claim-protocol.md: the parameter is a uuid, so PostgreSQL's own cast answers
    # 22P02 (not the function's 22023); nothing is registered.
    with raw() as conn:
        error = raw_fails(conn, "SELECT soniq_register_worker(%s, NULL, ARRAY['fleet.x'], "
                                "'h', 7)", ["not-a-uuid"])
        assert error.sqlstate == "22P02"
        assert conn.execute("SELECT count(*) FROM soniq_task_registry "
                            "WHERE task_name = 'fleet.x'").fetchone() == (0,)


def test_a_registered_attempt_limit_counts_for_jobs_without_their_own():
    fetch("SELECT soniq_register_worker(gen_random_uuid(), NULL, ARRAY['fleet.limited'], 'h', 9, "
          "NULL, ARRAY[1])")
    limited = fetch("SELECT soniq_enqueue('fleet.limited', '{}', queue => 'o', "
                    "max_attempts => NULL)")[0][0]
    other = fetch("SELECT soniq_enqueue('fleet.unlimited', '{}', queue => 'o', "
                  "max_attempts => NULL)")[0][0]
    for nonce in ("n-1", "n-2"):
        claim(nonce, lease=0.1)
    time.sleep(0.2)
    fetch("SELECT count(*) FROM soniq_claim('other', 'n-x', ARRAY['none'])")  # reaps both
    # One attempt spent: the registered limit (1) sends it to the dead letters; the
    # name nobody registered falls back to 4 and is queued again.
    assert fetch("SELECT dead_letter_reason FROM soniq_dead_letter_jobs WHERE id = %s",
                 [limited]) == [("max_retries_exceeded",)]
    assert fetch("SELECT status, max_attempts FROM soniq_jobs WHERE id = %s", [other]) == [
        ("queued", None)]
