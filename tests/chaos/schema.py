"""The chaos run's own tables in its private database, next to Soniq's.

``chaos_executions``: one row per handler execution, inserted by the handler
itself over its own autocommit connection before it does any work, so the
row exists even when the job's completion is lost (the worker was killed,
the lease lapsed, the database went away). ``exec_id`` is made by the
handler, so re-sending an insert whose acknowledgement was lost adds nothing.

``chaos_writes``: an audit of every write *applied* to soniq_jobs that
changed a row's status or claim generation, or deleted it, written by
triggers in the same transaction as the write (a write that did not commit
leaves no audit row). It carries the generation the write was made for: the
completion's result and a handler failure's error text both name the
generation of the execution that produced them. A failure the worker reports
for an atomic run that ended outside its handler (its completion or its
COMMIT failed) carries the worker's own text instead, kept by its head.

``chaos_effects`` (the effects scenario, tests/chaos/effects.py): the
handler's own database write, one row per execution, inserted inside the
job's atomic transaction. It has no unique constraint on purpose: a second
row for a job would be stored, so a duplicate shows. The columns
``effect_at``, ``backend_pid`` and ``sleep_until`` of ``chaos_executions``
are the handler's note (over its own autocommit connection) that it wrote
its effect row, from which backend, and until when it then sleeps: how the
driver picks a run mid-flight to SIGSTOP, and a backend to terminate.
``chaos_step_calls`` and ``chaos_step_effects`` (the steps scenario,
tests/chaos/steps.py): each call of a step's function, noted over the
handler's own connection, and its effect row, written in the step's
transaction.

``chaos_hold_ends``: every ``soniq_queue_holds`` row deleted (the slot a
timed-out handler that runs on keeps), written by a trigger in the deleting
transaction, with the hold's lease at that moment: a hold deleted at or past
its lease had lapsed (its worker stopped renewing it), and its key's slot
was given back then, not when the handler returned (tests/chaos/keys.py).
"""

SCHEMA_SQL = r"""
CREATE TABLE chaos_enqueued (
    job_id uuid PRIMARY KEY
);

CREATE TABLE chaos_executions (
    exec_id uuid PRIMARY KEY,
    job_id uuid NOT NULL,
    attempt integer NOT NULL,           -- current_job().attempts: the claim's generation
    pid integer NOT NULL,
    worker_id text,                     -- the soniq_workers row of this pid
    row_generation bigint,              -- the job row as the handler found it
    row_owner text,
    row_status text,
    row_lease timestamptz,
    started_at timestamptz NOT NULL,    -- database clock, the leases' clock
    finished_at timestamptz,            -- set when the handler body ran to its end
    effect_at timestamptz,              -- effects scenario: the effect row was written
    backend_pid integer,                -- ... by this server backend (the job's connection)
    sleep_until timestamptz             -- ... and the handler then sleeps until about this
);
CREATE INDEX ON chaos_executions (job_id);

CREATE TABLE chaos_effects (            -- no unique constraint: duplicates must show
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    generation bigint NOT NULL,
    exec_id uuid NOT NULL,
    backend_pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE TABLE chaos_step_calls (        -- the steps scenario: every call of a step's function
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    step integer NOT NULL,
    generation bigint NOT NULL,
    exec_id uuid NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_step_effects (      -- ... and its effect, in the step's transaction
    id bigserial PRIMARY KEY,           -- (no unique constraint: duplicates must show)
    job_id uuid NOT NULL,
    step integer NOT NULL,
    generation bigint NOT NULL,
    exec_id uuid NOT NULL,
    backend_pid integer NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE TABLE chaos_writes (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    op text NOT NULL,
    old_status text,
    new_status text,
    old_generation bigint,
    new_generation bigint,
    old_owner text,
    new_owner text,
    old_lease timestamptz,
    result_generation bigint,
    error_generation bigint,
    error_tail text,
    error_head text,                    -- how the error begins: the worker's own texts
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON chaos_writes (job_id);

-- The soniq functions run with search_path = pg_catalog, pg_temp: pin ours.
CREATE FUNCTION chaos_audit() RETURNS trigger LANGUAGE plpgsql
SET search_path = public, pg_catalog
AS $fn$
DECLARE
    v_error text;
BEGIN
    IF TG_OP = 'DELETE' THEN
        -- A move to the dead letters inserts there first: its error is visible here.
        SELECT d.last_error INTO v_error FROM soniq_dead_letter_jobs AS d WHERE d.id = OLD.id;
        INSERT INTO chaos_writes (job_id, op, old_status, old_generation, old_owner, old_lease,
                                  error_generation, error_tail, error_head)
        VALUES (OLD.id, 'delete', OLD.status, OLD.claim_generation, OLD.claim_owner,
                OLD.lease_expires_at,
                (substring(v_error from 'chaos-failure gen=([0-9]+)'))::bigint,
                right(v_error, 160), left(v_error, 80));
        RETURN OLD;
    END IF;
    INSERT INTO chaos_writes (job_id, op, old_status, new_status, old_generation, new_generation,
                              old_owner, new_owner, old_lease, result_generation,
                              error_generation, error_tail, error_head)
    VALUES (NEW.id, 'update', OLD.status, NEW.status, OLD.claim_generation,
            NEW.claim_generation, OLD.claim_owner, NEW.claim_owner, OLD.lease_expires_at,
            CASE WHEN jsonb_typeof(NEW.result) = 'object'
                      AND NEW.result ? 'generation'
                 THEN (NEW.result ->> 'generation')::bigint END,
            (substring(NEW.last_error from 'chaos-failure gen=([0-9]+)'))::bigint,
            right(NEW.last_error, 160), left(NEW.last_error, 80));
    RETURN NEW;
END
$fn$;

CREATE TABLE chaos_hold_ends (
    id bigserial PRIMARY KEY,
    job_id uuid NOT NULL,
    generation bigint NOT NULL,
    lease_expires_at timestamptz NOT NULL,  -- the hold's lease when it was deleted
    at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX ON chaos_hold_ends (job_id);

CREATE FUNCTION chaos_hold_end() RETURNS trigger LANGUAGE plpgsql
SET search_path = public, pg_catalog
AS $fn$
BEGIN
    INSERT INTO chaos_hold_ends (job_id, generation, lease_expires_at)
    VALUES (OLD.job_id, OLD.generation, OLD.lease_expires_at);
    RETURN OLD;
END
$fn$;

CREATE TRIGGER chaos_hold_end AFTER DELETE ON soniq_queue_holds FOR EACH ROW
    EXECUTE FUNCTION chaos_hold_end();

CREATE TRIGGER chaos_audit_update AFTER UPDATE ON soniq_jobs FOR EACH ROW
    WHEN (OLD.status IS DISTINCT FROM NEW.status
          OR OLD.claim_generation IS DISTINCT FROM NEW.claim_generation)
    EXECUTE FUNCTION chaos_audit();
CREATE TRIGGER chaos_audit_delete AFTER DELETE ON soniq_jobs FOR EACH ROW
    EXECUTE FUNCTION chaos_audit();
"""
