-- Who holds and who waits (SPEC §3.4, §4.1): the API key that took each lease,
-- slot and place in line, and when each waiter joined and will give up.
-- Only the key's id is kept; its name is read from api_keys when shown.
-- NULL for rows written before this migration (they show no key).
-- depends: 0005_replicas

ALTER TABLE locks ADD COLUMN key_id TEXT;
ALTER TABLE slots ADD COLUMN key_id TEXT;
ALTER TABLE lock_waiters ADD COLUMN key_id TEXT;
ALTER TABLE lock_waiters ADD COLUMN since_ms INTEGER;
ALTER TABLE lock_waiters ADD COLUMN gives_up_ms INTEGER;
