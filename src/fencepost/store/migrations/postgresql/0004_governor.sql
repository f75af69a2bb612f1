-- Adaptive admission (SPEC §4.5): the learned state of each pool, shared by
-- every server on the store, and the log of recent admissions for rpm pools.
-- depends: 0003_quota

ALTER TABLE pools ADD COLUMN gov_limit DOUBLE PRECISION;            -- NULL: the configured limit
ALTER TABLE pools ADD COLUMN gov_plateau DOUBLE PRECISION;
ALTER TABLE pools ADD COLUMN gov_last_decrease_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN gov_hold_ms DOUBLE PRECISION;
ALTER TABLE pools ADD COLUMN paused_until_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN learned_rpm BIGINT;
ALTER TABLE pools ADD COLUMN window_reset_ms BIGINT;

-- One row per admission of a pool with a rate; rows older than a minute are pruned.
CREATE TABLE pool_admissions (
    project     TEXT COLLATE "C" NOT NULL,
    pool        TEXT COLLATE "C" NOT NULL,
    admitted_ms BIGINT NOT NULL
);
CREATE INDEX pool_admissions_window ON pool_admissions (project, pool, admitted_ms);
