-- A pool's admission version (store/sql/pools.py): a new random number each
-- time a write changes what admission is decided on (its configuration, what
-- its governor learned), so a writer that remembers a pool as of a version can
-- admit by one guarded insert while the row still has that version. Random,
-- not counted: a version written by a transaction that rolled back must never
-- name another state later. Existing rows start at 0, each a state of its own.
-- depends: 0012_token_sequence

ALTER TABLE pools ADD COLUMN admission_version BIGINT NOT NULL DEFAULT 0;

-- A write that changes what admission is decided on and leaves the version as
-- it was (a replica of an older release, which knows no version) gets a new
-- one all the same, so that no writer goes on admitting by the state it
-- remembers. The writers of this release set the version themselves.
CREATE FUNCTION fencepost_new_admission_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.admission_version := (random() * 4611686018427387903)::bigint;
    RETURN NEW;
END $$;

CREATE TRIGGER pools_admission_version BEFORE UPDATE OF
    slot_limit, queue_size, queue_timeout_ms, term_ms, renew_interval_ms,
    request_timeout_ms, rpm, adaptive, min_limit, gov_limit, gov_plateau,
    gov_last_decrease_ms, gov_hold_ms, paused_until_ms, learned_rpm,
    window_reset_ms, gov_window_ms, paused_since_ms, probe_gap_ms,
    next_probe_ms, gov_ok_hold_ms, gov_base_hold_ms, last_success_ms,
    hinted_streak, hint_source, hint_retry_after_ms, hint_at_ms,
    probe_since_ms, gov_probe_hold_ms, latency_bound, last_throttle_ms
ON pools FOR EACH ROW
WHEN (NEW.admission_version = OLD.admission_version AND ROW(
    OLD.slot_limit, OLD.queue_size, OLD.queue_timeout_ms, OLD.term_ms,
    OLD.renew_interval_ms, OLD.request_timeout_ms, OLD.rpm, OLD.adaptive,
    OLD.min_limit, OLD.gov_limit, OLD.gov_plateau,
    OLD.gov_last_decrease_ms, OLD.gov_hold_ms, OLD.paused_until_ms,
    OLD.learned_rpm, OLD.window_reset_ms, OLD.gov_window_ms,
    OLD.paused_since_ms, OLD.probe_gap_ms, OLD.next_probe_ms,
    OLD.gov_ok_hold_ms, OLD.gov_base_hold_ms, OLD.last_success_ms,
    OLD.hinted_streak, OLD.hint_source, OLD.hint_retry_after_ms,
    OLD.hint_at_ms, OLD.probe_since_ms, OLD.gov_probe_hold_ms,
    OLD.latency_bound, OLD.last_throttle_ms
) IS DISTINCT FROM ROW(
    NEW.slot_limit, NEW.queue_size, NEW.queue_timeout_ms, NEW.term_ms,
    NEW.renew_interval_ms, NEW.request_timeout_ms, NEW.rpm, NEW.adaptive,
    NEW.min_limit, NEW.gov_limit, NEW.gov_plateau,
    NEW.gov_last_decrease_ms, NEW.gov_hold_ms, NEW.paused_until_ms,
    NEW.learned_rpm, NEW.window_reset_ms, NEW.gov_window_ms,
    NEW.paused_since_ms, NEW.probe_gap_ms, NEW.next_probe_ms,
    NEW.gov_ok_hold_ms, NEW.gov_base_hold_ms, NEW.last_success_ms,
    NEW.hinted_streak, NEW.hint_source, NEW.hint_retry_after_ms,
    NEW.hint_at_ms, NEW.probe_since_ms, NEW.gov_probe_hold_ms,
    NEW.latency_bound, NEW.last_throttle_ms
))
EXECUTE FUNCTION fencepost_new_admission_version();
