-- Which server process put each waiter in line, so that the waiters of a
-- replica that died leave every line at once (SPEC §7.4), not only when their
-- alive_until_ms runs out. One row per live server process (replica); a
-- replica's id is random for each life of the process.
-- depends: 0004_governor

CREATE TABLE replicas (
    id         TEXT PRIMARY KEY,
    started_ms INTEGER NOT NULL
);

-- NULL for rows written before this migration: they age out by alive_until_ms.
-- No index: waiters are looked up by replica only when a replica died.
ALTER TABLE lock_waiters ADD COLUMN replica TEXT;
ALTER TABLE slot_waiters ADD COLUMN replica TEXT;
