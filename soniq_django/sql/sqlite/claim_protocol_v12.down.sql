-- Reverse of claim_protocol_v12.sql (SQLite): its triggers.
DROP TRIGGER soniq_key_admit;
DROP TRIGGER soniq_key_hold_gone;
DROP TRIGGER soniq_key_deferred;
DROP TRIGGER soniq_key_gone;
DROP TRIGGER soniq_key_moved;
