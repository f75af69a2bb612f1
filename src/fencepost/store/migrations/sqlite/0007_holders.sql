-- Which API key took each lease and put each waiter in line, so that a lock
-- shows its holder and line (SPEC §3.4) and a member may force-release a lease
-- its own key took (SPEC §3.5). NULL for rows written before this migration.
-- depends: 0005_replicas

ALTER TABLE locks ADD COLUMN key_id TEXT;
ALTER TABLE lock_waiters ADD COLUMN key_id TEXT;
ALTER TABLE lock_waiters ADD COLUMN gives_up_ms BIGINT;
