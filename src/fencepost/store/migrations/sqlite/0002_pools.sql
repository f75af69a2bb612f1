-- Pools: counting semaphores (SPEC §4). Instants are Unix epoch milliseconds.
-- depends: 0001_initial

CREATE TABLE pools (
    project            TEXT NOT NULL,
    name               TEXT NOT NULL,
    slot_limit         INTEGER NOT NULL,
    queue_size         INTEGER NOT NULL,
    queue_timeout_ms   INTEGER NOT NULL,
    term_ms            INTEGER NOT NULL,
    renew_interval_ms  INTEGER,
    request_timeout_ms INTEGER NOT NULL,
    rpm                INTEGER,
    adaptive           INTEGER NOT NULL,
    min_limit          INTEGER NOT NULL,
    created_ms         INTEGER NOT NULL,
    updated_ms         INTEGER NOT NULL,
    -- outcome statistics reported on release; the adaptive governor learns from them
    released           INTEGER NOT NULL DEFAULT 0,
    reclaimed          INTEGER NOT NULL DEFAULT 0,
    status_1xx         INTEGER NOT NULL DEFAULT 0,
    status_2xx         INTEGER NOT NULL DEFAULT 0,
    status_3xx         INTEGER NOT NULL DEFAULT 0,
    status_4xx         INTEGER NOT NULL DEFAULT 0,
    status_5xx         INTEGER NOT NULL DEFAULT 0,
    status_429         INTEGER NOT NULL DEFAULT 0,
    throttled          INTEGER NOT NULL DEFAULT 0,
    last_retry_after_ms INTEGER,
    last_report        TEXT,
    last_reported_ms   INTEGER,
    PRIMARY KEY (project, name)
) WITHOUT ROWID;

-- One row per held slot; a slot is live while now < lease_deadline_ms
-- (which never passes request_deadline_ms).
CREATE TABLE slots (
    slot_id             TEXT PRIMARY KEY,
    project             TEXT NOT NULL,
    pool                TEXT NOT NULL,
    acquired_ms         INTEGER NOT NULL,
    lease_deadline_ms   INTEGER NOT NULL,
    request_deadline_ms INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX slots_by_pool ON slots (project, pool, lease_deadline_ms);
CREATE INDEX slots_by_deadline ON slots (lease_deadline_ms);

CREATE TABLE slot_waiters (
    ticket         INTEGER PRIMARY KEY AUTOINCREMENT,
    project        TEXT NOT NULL,
    pool           TEXT NOT NULL,
    alive_until_ms INTEGER NOT NULL
);
CREATE INDEX slot_waiters_line ON slot_waiters (project, pool, ticket);
CREATE INDEX slot_waiters_by_life ON slot_waiters (alive_until_ms);
