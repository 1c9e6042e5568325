-- Reverse of attempts_v1.sql (SQLite).
DROP TRIGGER soniq_attempts_dead_letter_gone;
DROP TRIGGER soniq_attempts_job_gone;
DROP TRIGGER soniq_attempt_dead;
DROP TRIGGER soniq_attempt_ended;
DROP TRIGGER soniq_attempt_given_back;
