-- Reverse of protect_owned_v2.sql: the trigger of claim_protocol_v1.sql again.
DROP TRIGGER soniq_protect_owned ON {schema}.soniq_jobs;

CREATE TRIGGER soniq_protect_owned
    BEFORE UPDATE OR DELETE ON {schema}.soniq_jobs
    FOR EACH ROW
    WHEN (OLD.fence_required OR (OLD.claim_token IS NOT NULL AND OLD.status = 'processing'))
    EXECUTE FUNCTION {schema}.soniq_protect_owned_v1();

DROP FUNCTION {schema}.soniq_protect_owned_v2();
