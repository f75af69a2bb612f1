-- A key holds at most 1,000 live sessions (SPEC §5): a new session counts the
-- creating key's live ones by this index.
-- depends: 0016_pause_reporters

CREATE INDEX sessions_live_by_key ON sessions (key_id) WHERE ended_reason IS NULL;
