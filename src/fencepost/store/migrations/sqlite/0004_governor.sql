-- Adaptive admission (SPEC §4.5): the learned state of each pool, shared by
-- every server on the store, and the log of recent admissions for rpm pools.
-- depends: 0003_quota

ALTER TABLE pools ADD COLUMN gov_limit REAL;            -- NULL: the configured limit
ALTER TABLE pools ADD COLUMN gov_plateau REAL;
ALTER TABLE pools ADD COLUMN gov_last_decrease_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN gov_hold_ms REAL;
ALTER TABLE pools ADD COLUMN paused_until_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN learned_rpm INTEGER;
ALTER TABLE pools ADD COLUMN window_reset_ms INTEGER;

-- One row per admission of a pool with a rate; rows older than a minute are pruned.
CREATE TABLE pool_admissions (
    project     TEXT NOT NULL,
    pool        TEXT NOT NULL,
    admitted_ms INTEGER NOT NULL
);
CREATE INDEX pool_admissions_window ON pool_admissions (project, pool, admitted_ms);
