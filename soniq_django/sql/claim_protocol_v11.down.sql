-- Reverse of claim_protocol_v11.sql. Nothing to drop: version 11 only replaced
-- the body of soniq_complete_many, which migration 0023 puts back from
-- claim_protocol_v8.sql (same signature, so grants on it are kept), and set
-- enable_sort and jit on soniq_claim_many, reset here.
ALTER FUNCTION {schema}.soniq_claim_many(text, text[], text[], double precision,
                                         double precision, integer)
    RESET enable_sort RESET jit;
