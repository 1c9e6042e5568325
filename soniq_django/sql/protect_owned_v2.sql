-- soniq_django protection trigger, version 2 (PostgreSQL only).
--
-- Loaded by migration 0007_protect_owned_v2 with {schema} replaced by the
-- schema of the soniq tables; never edited once released. It replaces the
-- trigger of claim_protocol_v1.sql (soniq_protect_owned) after running
-- Soniq 0.1.0's own worker against soniq_django's tables showed two faults
-- (docs/interop.md):
--
-- 1. A job that a soniq_django worker tried and queued again for a retry
--    keeps that attempt's claim token. When a worker that claims by id alone
--    (Soniq 0.1.0) then took it, the row became 'processing' with a token,
--    which v1 took for a live owned claim, so it skipped that worker's
--    completion: the job stayed 'processing' forever, its result lost. A
--    live owned claim always has a lease (soniq_claim sets one; nothing
--    clears it while the row is processing), so v2 protects a processing
--    row with a token only while it also has a lease.
--
-- 2. An owned submission (fence_required) is never claimed by anything but
--    soniq_claim. v1 skipped an id-only worker's claim of one silently, and
--    Soniq 0.1.0 then ran the handler anyway, found the row still queued and
--    ran it again, without end. v2 refuses that claim with an error
--    (SQLSTATE 55000, HINT QUEUE_CLAIM_CONFLICT), so such a worker runs
--    nothing and the row waits for a fenced claim. Every other write to a
--    protected row that does not come through the gate is still skipped.

CREATE FUNCTION {schema}.soniq_protect_owned_v2() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF pg_catalog.current_setting('soniq.fenced_write', true) = 'on' THEN
        IF TG_OP = 'DELETE' THEN
            RETURN OLD;
        END IF;
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.fence_required AND OLD.status = 'queued'
       AND NEW.status = 'processing' THEN
        RAISE EXCEPTION 'this job is an owned submission: only a fenced claim (soniq_claim) may start it'
            USING ERRCODE = '55000', HINT = 'QUEUE_CLAIM_CONFLICT';
    END IF;
    RETURN NULL;
END
$fn$;

REVOKE ALL ON FUNCTION {schema}.soniq_protect_owned_v2() FROM PUBLIC;

DROP TRIGGER soniq_protect_owned ON {schema}.soniq_jobs;

CREATE TRIGGER soniq_protect_owned
    BEFORE UPDATE OR DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.fence_required
          OR (OLD.claim_token IS NOT NULL AND OLD.status = 'processing'
              AND OLD.lease_expires_at IS NOT NULL))
    EXECUTE FUNCTION {schema}.soniq_protect_owned_v2();
