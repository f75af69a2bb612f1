-- fencepost schema, version 1 (SQLite). Instants are Unix epoch milliseconds.

-- Store-wide settings, e.g. the pepper for API key hashes.
CREATE TABLE meta (
    name  TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

-- The fencing counter lives in a row, bumped in the same transaction as the
-- lease it is issued with: it can neither repeat nor go backwards.
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO counters (name, value) VALUES ('fencing', 0);

CREATE TABLE projects (
    name       TEXT PRIMARY KEY,
    created_ms INTEGER NOT NULL
);

CREATE TABLE api_keys (
    id          TEXT PRIMARY KEY,
    project     TEXT NOT NULL REFERENCES projects(name),
    role        TEXT NOT NULL,
    name        TEXT,
    secret_hash TEXT NOT NULL UNIQUE,
    created_ms  INTEGER NOT NULL,
    expires_ms  INTEGER,
    allow_ips   TEXT NOT NULL DEFAULT '[]',
    rpm_quota   INTEGER,
    revoked_ms  INTEGER
);
CREATE INDEX api_keys_by_project ON api_keys (project, created_ms);

-- One row per held lock; dies_ms is when the lease ends unless renewed
-- (expires_ms for `release`, deadline_ms for `keep`), so the reaper needs one index.
CREATE TABLE locks (
    project       TEXT NOT NULL,
    key           TEXT NOT NULL,
    lock_token    TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    acquired_ms   INTEGER NOT NULL,
    expires_ms    INTEGER NOT NULL,
    deadline_ms   INTEGER NOT NULL,
    dies_ms       INTEGER NOT NULL,
    operation     TEXT,
    metadata      TEXT,
    on_expiry     TEXT NOT NULL,
    PRIMARY KEY (project, key)
) WITHOUT ROWID;
CREATE INDEX locks_by_death ON locks (dies_ms);

-- The line of callers waiting for a lock. Tickets only grow, so ticket order is
-- arrival order; a waiter whose server stops refreshing alive_until_ms is dead.
CREATE TABLE lock_waiters (
    ticket         INTEGER PRIMARY KEY AUTOINCREMENT,
    project        TEXT NOT NULL,
    key            TEXT NOT NULL,
    lock_token     TEXT NOT NULL,
    alive_until_ms INTEGER NOT NULL
);
CREATE INDEX lock_waiters_line ON lock_waiters (project, key, ticket);
CREATE INDEX lock_waiters_by_life ON lock_waiters (alive_until_ms);

-- How recent leases ended, so a late renewal can be told why it lost the lock.
CREATE TABLE ended_leases (
    project    TEXT NOT NULL,
    key        TEXT NOT NULL,
    lock_token TEXT NOT NULL,
    reason     TEXT NOT NULL,
    ended_ms   INTEGER NOT NULL,
    PRIMARY KEY (project, key, lock_token)
) WITHOUT ROWID;
CREATE INDEX ended_leases_by_age ON ended_leases (ended_ms);
