-- Bounds count per lineage, not per key (SPEC §5): a key and every key
-- refreshed from it share one refresh a minute and 1,000 live sessions. A
-- refresh reads the lineage's newest key by root, a new session counts the
-- lineage's live sessions by their owner_root (the lineage's first key).
-- depends: 0019_key_retired

CREATE INDEX api_keys_by_root ON api_keys (root_id);
CREATE INDEX sessions_live_by_root ON sessions (owner_root) WHERE ended_reason IS NULL;
DROP INDEX sessions_live_by_key;
