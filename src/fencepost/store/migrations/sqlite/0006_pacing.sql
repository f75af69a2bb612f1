-- Pacing and evidence-weighed retry hints (SPEC §4.5): a pool's rate is kept
-- as one GCRA theoretical arrival time instead of a log of admissions, the
-- learned quota has the window its headers state, and a pause remembers when
-- it began and when it may next be probed. Shared by every server on the store.
-- depends: 0004_governor

ALTER TABLE pools ADD COLUMN pace_tat_ms REAL NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN gov_window_ms INTEGER;
ALTER TABLE pools ADD COLUMN paused_since_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN probe_gap_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN next_probe_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN gov_ok_hold_ms REAL;
ALTER TABLE pools ADD COLUMN gov_base_hold_ms REAL;
ALTER TABLE pools ADD COLUMN last_success_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN hinted_streak INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN hint_source TEXT;
ALTER TABLE pools ADD COLUMN hint_retry_after_ms INTEGER;
ALTER TABLE pools ADD COLUMN hint_at_ms INTEGER;
ALTER TABLE pools ADD COLUMN probe_since_ms INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN gov_probe_hold_ms REAL;
ALTER TABLE pools ADD COLUMN latency_bound INTEGER NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN last_throttle_ms INTEGER NOT NULL DEFAULT 0;

DROP TABLE pool_admissions;
