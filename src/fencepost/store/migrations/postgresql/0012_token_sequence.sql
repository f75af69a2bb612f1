-- Fencing tokens from a sequence, so that grants of different locks commit
-- concurrently (SPEC §1: tokens rise per lock and are never issued twice).
-- A token is drawn while its lock's key is held, after every earlier grant of
-- that lock committed; nextval never hands a value out twice, and a value drawn
-- by a committed transaction survives a crash (its WAL is flushed first).
-- depends: 0008_primitives

CREATE SEQUENCE fencing_tokens AS BIGINT MINVALUE 1;
-- Carry on above every token the counter row issued (the row stays, unused).
-- In a DO block: a migration's SELECT would print its result.
DO $$ BEGIN
    PERFORM setval('fencing_tokens', GREATEST(value, 1)) FROM counters WHERE name = 'fencing';
END $$;
