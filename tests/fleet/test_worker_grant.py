"""``soniq_grant --worker``: a fresh role with that grant alone drives the whole protocol.

It registers, beats, claims (one and many), renews, reports progress and its
pid, reads its state, completes, fails with a retry, defers, acknowledges a
cancel, holds and releases a slot, recovers a claim and settles an
uncertain write -- and every read or write of a soniq table, and the
producer's soniq_enqueue, is refused with 42501.
"""

import io
import uuid

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from soniq_django import enqueue
from soniq_django.grants import PRODUCER_FUNCTIONS, WORKER_FUNCTIONS
from soniq_django.models import Job, TaskRegistration, Worker as WorkerRow
from tests.support.sql import Roles, fetch, raw, raw_fails

pytestmark = [pytest.mark.postgresql_only, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def roles():
    made = Roles()
    yield made
    made.drop_all()


def grant(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("soniq_grant", *args, stdout=out)
    return out.getvalue().splitlines()


def executable(role: str) -> set[str]:
    rows = fetch("SELECT p.oid::regprocedure::text, has_function_privilege(%s, p.oid, 'EXECUTE') "
                 "FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace "
                 "AND p.proname LIKE 'soniq\\_%%'", [role])
    return {name.split("(")[0] for name, allowed in rows if allowed}


def names(functions) -> set[str]:
    return {function.split("(")[0] for function in functions}


def test_the_worker_grant_is_exactly_the_worker_functions(roles):
    role = roles.create("soniq_worker")
    statements = grant(role, "--worker")
    assert len(statements) == 1 + len(WORKER_FUNCTIONS)
    assert executable(role) == names(WORKER_FUNCTIONS)
    assert "soniq_set_progress" in executable(role) and "soniq_enqueue" not in executable(role)


def test_the_producer_grant_is_the_default_and_both_may_be_given(roles):
    producer, both = roles.create("soniq_producer"), roles.create("soniq_both")
    grant(producer)
    assert executable(producer) == names(PRODUCER_FUNCTIONS)
    grant(both, "--producer", "--worker")
    assert executable(both) == names(PRODUCER_FUNCTIONS) | names(WORKER_FUNCTIONS)


def test_an_unknown_role_is_a_command_error():
    with pytest.raises(CommandError, match="Granting failed"):
        grant(f"nobody_{uuid.uuid4().hex[:8]}", "--worker")


def one(conn, sql, params=()):
    return conn.execute(sql, params).fetchone()


def test_a_fresh_role_with_the_worker_grant_drives_the_whole_protocol(roles):
    role = roles.create("soniq_worker")
    grant(role, "--worker")
    worker = str(uuid.uuid4())
    first, second, third, fourth, fifth = (
        enqueue("fleet.grant", {"n": n}, queue="fleet") for n in range(5))
    with roles.connect(role) as conn:
        one(conn, "SELECT soniq_register_worker(%s, ARRAY['fleet'], ARRAY['fleet.grant'], "
                  "p_label => 'grant test 1.0', p_max_attempts => ARRAY[3])", [worker])
        assert one(conn, "SELECT soniq_worker_heartbeat(%s)", [worker]) == (True,)

        # claim, renew, progress, pid, state, complete
        job, generation, token = claim(conn, worker, "n-1")
        fence = [job, worker, generation, token, "fleet"]
        assert job == str(first)
        assert one(conn, "SELECT soniq_heartbeat(%s, %s, %s, %s, %s, 30)", fence) == (True,)
        assert one(conn, "SELECT soniq_set_progress(%s, %s, %s, %s, %s, 1, 2)", fence) == (True,)
        assert one(conn, "SELECT soniq_set_pid(%s, %s, %s, %s, %s, 4242)", fence) == (True,)
        # a durable step: looked up, recorded under the fence, found again
        assert one(conn, "SELECT * FROM soniq_get_step(%s, %s, %s, %s, %s, 'fetch')", fence) == (
            True, False, None)
        assert one(conn, "SELECT soniq_record_step(%s, %s, %s, %s, %s, 'fetch', '{\"n\": 1}')",
                   fence) == (True,)
        assert one(conn, "SELECT * FROM soniq_get_step(%s, %s, %s, %s, %s, 'fetch')", fence) == (
            True, True, {"n": 1})
        assert one(conn, "SELECT soniq_key_sweep()") == (0,)
        assert one(conn, "SELECT soniq_settle_lapsed(300)") == (0,)  # claim protocol v14
        assert one(conn, "SELECT * FROM soniq_get_state(%s, %s, %s, %s, %s)", fence) == (
            False, 4242)
        assert one(conn, "SELECT soniq_complete(%s, %s, %s, %s, %s, '{\"ok\": 1}')", fence) == (
            True,)
        assert one(conn, "SELECT outcome FROM soniq_claim_outcome(%s, %s, %s, %s)",
                   fence[:4]) == ("completed",)

        # two at once; one completed by soniq_complete_many, one failed with a retry
        rows = conn.execute("SELECT job_id::text, generation, token FROM soniq_claim_many("
                            "%s, ARRAY['n-2', 'n-3'], ARRAY['fleet'])", [worker]).fetchall()
        assert [row[0] for row in rows] == [str(second), str(third)]
        (a, ga, ta), (b, gb, tb) = rows
        assert one(conn, "SELECT soniq_complete_many(ARRAY[%s], %s, ARRAY[%s]::bigint[], "
                         "ARRAY[%s], ARRAY['fleet'], ARRAY['null'::jsonb])",
                   [a, worker, ga, ta]) == ([True],)
        assert one(conn, "SELECT soniq_fail(%s, %s, %s, %s, 'fleet', 'boom', true, 0)",
                   [b, worker, gb, tb]) == (True,)

        # the retried job: recovered by its nonce, a slot held and released, deferred
        job, generation, token = claim(conn, worker, "n-4")
        assert job == str(third)
        assert one(conn, "SELECT job_id::text FROM soniq_recover_claim(%s, 'n-4')",
                   [worker]) == (job,)
        fence = [job, worker, generation, token, "fleet"]
        assert one(conn, "SELECT soniq_hold_slot(%s, %s, %s, %s, %s)", fence) == (True,)
        assert one(conn, "SELECT soniq_renew_holds(%s, ARRAY[%s], ARRAY[%s]::bigint[])",
                   [worker, job, generation]) == (1,)
        assert one(conn, "SELECT soniq_release_hold(%s, %s, %s)", fence[:3]) == (True,)
        assert one(conn, "SELECT soniq_defer(%s, %s, %s, %s, %s, 'not here', 60)", fence) == (
            True,)
        assert one(conn, "SELECT outcome FROM soniq_claim_outcome(%s, %s, %s, %s)",
                   fence[:4]) == ("deferred",)

        # a cancel requested by an operator, acknowledged by the worker
        job, generation, token = claim(conn, worker, "n-5")
        fence = [job, worker, generation, token, "fleet"]
        fetch("SELECT soniq_request_cancel(%s::uuid)", [job])
        assert one(conn, "SELECT cancel_requested FROM soniq_get_state(%s, %s, %s, %s, %s)",
                   fence) == (True,)
        assert one(conn, "SELECT soniq_acknowledge_cancel(%s, %s, %s, %s, %s)", fence) == (True,)

        # ... and no table, nor the producer's function
        for sql in ("SELECT * FROM soniq_jobs", "UPDATE soniq_jobs SET priority = 1",
                    "DELETE FROM soniq_dead_letter_jobs",
                    "INSERT INTO soniq_workers (id, hostname, pid) VALUES (gen_random_uuid(), 'h', 1)",
                    "SELECT * FROM soniq_task_registry", "SELECT * FROM soniq_job_progress",
                    "SELECT * FROM soniq_queue_settings",
                    "SELECT soniq_enqueue('fleet.grant', '{}')",
                    "SELECT soniq_request_cancel(gen_random_uuid())"):
            assert raw_fails(conn, sql).sqlstate == "42501", sql
        assert one(conn, "SELECT soniq_worker_heartbeat(%s, 'stopped')", [worker]) == (True,)

    statuses = dict(Job.objects.values_list("id", "status"))
    assert [statuses[j] for j in (first, second, third, fourth, fifth)] == [
        "done", "done", "queued", "cancelled", "queued"]
    row = WorkerRow.objects.get(id=worker)
    assert (row.status, row.version) == ("stopped", "grant test 1.0")
    assert TaskRegistration.objects.get(worker_id=worker).max_attempts == 3


def claim(conn, worker: str, nonce: str) -> tuple[str, int, str]:
    row = one(conn, "SELECT job_id::text, generation, token FROM soniq_claim(%s, %s, "
                    "ARRAY['fleet'])", [worker, nonce])
    assert row is not None
    return row


def test_a_role_without_the_grant_cannot_register(roles):
    role = roles.create("soniq_stranger")
    with roles.connect(role) as conn:
        error = raw_fails(conn, "SELECT soniq_register_worker(gen_random_uuid(), NULL, NULL)")
        assert error.sqlstate == "42501"
    with raw() as admin:  # the stranger wrote nothing
        assert admin.execute("SELECT count(*) FROM soniq_workers").fetchone() == (0,)


def test_the_worker_functions_run_as_definer_with_a_fixed_search_path_and_no_public_execute():
    rows = fetch(
        "SELECT p.oid::regprocedure::text, p.prosecdef, p.proconfig, "
        "       has_function_privilege('public', p.oid, 'EXECUTE') "
        "  FROM pg_proc AS p WHERE p.pronamespace = current_schema()::regnamespace "
        "   AND p.proname = ANY(%s)", [sorted(names(WORKER_FUNCTIONS))])
    assert len(rows) == len(WORKER_FUNCTIONS)  # one function per name
    for signature, secdef, config, public in rows:
        assert secdef and not public, signature
        assert config[0] == "search_path=pg_catalog, pg_temp", signature
