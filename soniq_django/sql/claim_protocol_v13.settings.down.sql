-- Reverse of claim_protocol_v13.sql, last part: version 10's soniq_claim_many,
-- put back by CREATE OR REPLACE, came without the settings that version 11
-- gave it (a replaced function keeps none of its own): given again, as
-- claim_protocol_v11.sql gave them.
ALTER FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision,
                                         double precision, integer)
    SET enable_sort = off SET jit = off;
