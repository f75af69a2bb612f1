-- fencepost schema, version 1 (PostgreSQL). Instants are Unix epoch milliseconds.
-- Names are compared byte by byte (COLLATE "C") so listing order and prefix
-- ranges match SQLite and the API's cursor rules.

-- Store-wide settings, e.g. the pepper for API key hashes.
CREATE TABLE meta (
    name  TEXT COLLATE "C" PRIMARY KEY,
    value TEXT NOT NULL
);

-- The fencing counter lives in a row, bumped in the same transaction as the
-- lease it is issued with: it can neither repeat nor go backwards.
CREATE TABLE counters (
    name  TEXT COLLATE "C" PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO counters (name, value) VALUES ('fencing', 0);

CREATE TABLE projects (
    name       TEXT COLLATE "C" PRIMARY KEY,
    created_ms BIGINT NOT NULL
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    project     TEXT COLLATE "C" NOT NULL REFERENCES projects(name),
    role        TEXT NOT NULL,
    name        TEXT COLLATE "C",
    secret_hash TEXT NOT NULL UNIQUE,
    created_ms  BIGINT NOT NULL,
    expires_ms  BIGINT,
    allow_ips   TEXT NOT NULL DEFAULT '[]',
    rpm_quota   BIGINT,
    revoked_ms  BIGINT
);
CREATE INDEX api_keys_by_project ON api_keys (project, created_ms);

-- One row per held lock; dies_ms is when the lease ends unless renewed
-- (expires_ms for `release`, deadline_ms for `keep`), so the reaper needs one index.
CREATE TABLE locks (
    project       TEXT COLLATE "C" NOT NULL,
    key           TEXT COLLATE "C" NOT NULL,
    lock_token    TEXT NOT NULL,
    fencing_token BIGINT NOT NULL,
    acquired_ms   BIGINT NOT NULL,
    expires_ms    BIGINT NOT NULL,
    deadline_ms   BIGINT NOT NULL,
    dies_ms       BIGINT NOT NULL,
    operation     TEXT,
    metadata      TEXT,
    on_expiry     TEXT NOT NULL,
    PRIMARY KEY (project, key)
);
CREATE INDEX locks_by_death ON locks (dies_ms);

-- The line of callers waiting for a lock. Tickets only grow, so ticket order is
-- arrival order; a waiter whose server stops refreshing alive_until_ms is dead.
CREATE TABLE lock_waiters (
    ticket         BIGSERIAL PRIMARY KEY,
    project        TEXT COLLATE "C" NOT NULL,
    key            TEXT COLLATE "C" NOT NULL,
    lock_token     TEXT NOT NULL,
    alive_until_ms BIGINT NOT NULL
);
CREATE INDEX lock_waiters_line ON lock_waiters (project, key, ticket);
CREATE INDEX lock_waiters_by_life ON lock_waiters (alive_until_ms);

-- How recent leases ended, so a late renewal can be told why it lost the lock.
CREATE TABLE ended_leases (
    project    TEXT COLLATE "C" NOT NULL,
    key        TEXT COLLATE "C" NOT NULL,
    lock_token TEXT NOT NULL,
    reason     TEXT NOT NULL,
    ended_ms   BIGINT NOT NULL,
    PRIMARY KEY (project, key, lock_token)
);
CREATE INDEX ended_leases_by_age ON ended_leases (ended_ms);
