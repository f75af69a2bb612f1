-- Pools: counting semaphores (SPEC §4). Instants are Unix epoch milliseconds.
-- depends: 0001_initial

CREATE TABLE pools (
    project            TEXT COLLATE "C" NOT NULL,
    name               TEXT COLLATE "C" NOT NULL,
    slot_limit         BIGINT NOT NULL,
    queue_size         BIGINT NOT NULL,
    queue_timeout_ms   BIGINT NOT NULL,
    term_ms            BIGINT NOT NULL,
    renew_interval_ms  BIGINT,
    request_timeout_ms BIGINT NOT NULL,
    rpm                BIGINT,
    adaptive           BIGINT NOT NULL,
    min_limit          BIGINT NOT NULL,
    created_ms         BIGINT NOT NULL,
    updated_ms         BIGINT NOT NULL,
    -- outcome statistics reported on release; the adaptive governor learns from them
    released           BIGINT NOT NULL DEFAULT 0,
    reclaimed          BIGINT NOT NULL DEFAULT 0,
    status_1xx         BIGINT NOT NULL DEFAULT 0,
    status_2xx         BIGINT NOT NULL DEFAULT 0,
    status_3xx         BIGINT NOT NULL DEFAULT 0,
    status_4xx         BIGINT NOT NULL DEFAULT 0,
    status_5xx         BIGINT NOT NULL DEFAULT 0,
    status_429         BIGINT NOT NULL DEFAULT 0,
    throttled          BIGINT NOT NULL DEFAULT 0,
    last_retry_after_ms BIGINT,
    last_report        TEXT,
    last_reported_ms   BIGINT,
    PRIMARY KEY (project, name)
);

-- One row per held slot; a slot is live while now < lease_deadline_ms
-- (which never passes request_deadline_ms).
CREATE TABLE slots (
    slot_id             TEXT PRIMARY KEY,
    project             TEXT COLLATE "C" NOT NULL,
    pool                TEXT COLLATE "C" NOT NULL,
    acquired_ms         BIGINT NOT NULL,
    lease_deadline_ms   BIGINT NOT NULL,
    request_deadline_ms BIGINT NOT NULL
);
CREATE INDEX slots_by_pool ON slots (project, pool, lease_deadline_ms);
CREATE INDEX slots_by_deadline ON slots (lease_deadline_ms);

CREATE TABLE slot_waiters (
    ticket         BIGSERIAL PRIMARY KEY,
    project        TEXT COLLATE "C" NOT NULL,
    pool           TEXT COLLATE "C" NOT NULL,
    alive_until_ms BIGINT NOT NULL
);
CREATE INDEX slot_waiters_line ON slot_waiters (project, pool, ticket);
CREATE INDEX slot_waiters_by_life ON slot_waiters (alive_until_ms);
