-- Fence checks, lock delay and key refresh (SPEC §3.8, §3.9, §5).
-- depends: 0007_holders

-- Which fencing token each ended lease had, so that a fence check can tell why
-- a token is stale (NULL for leases that ended before this migration).
ALTER TABLE ended_leases ADD COLUMN fencing_token BIGINT;
CREATE INDEX ended_leases_by_token ON ended_leases (project, key, fencing_token);

-- The lock delay a lease asked for, applied when it ends by expiry or force release.
ALTER TABLE locks ADD COLUMN lock_delay_ms BIGINT NOT NULL DEFAULT 0;

-- Locks in their delay: nobody is granted one before until_ms. A row is
-- removed (and the lock's line woken) by the reaper once until_ms has passed.
CREATE TABLE lock_delays (
    project  TEXT COLLATE "C" NOT NULL,
    key      TEXT COLLATE "C" NOT NULL,
    until_ms BIGINT NOT NULL,
    PRIMARY KEY (project, key)
);
CREATE INDEX lock_delays_by_end ON lock_delays (until_ms);

-- Key refresh: each successor names the key it was minted from (revoking a key
-- revokes every key minted from it, transitively) and its chain's root, and
-- carries the lifetime an admin granted the root (NULL: no expiry), which no
-- successor may exceed.
ALTER TABLE api_keys ADD COLUMN parent_id TEXT;
ALTER TABLE api_keys ADD COLUMN root_id TEXT;
ALTER TABLE api_keys ADD COLUMN granted_lifetime_ms BIGINT;
CREATE INDEX api_keys_by_parent ON api_keys (parent_id);
