-- Proxy mode (SPEC §4.7): the upstream a pool calls (JSON: base_url, headers,
-- timeout_ms; NULL when the pool has none) and the largest proxied body.
-- depends: 0020_lineage_bounds

ALTER TABLE pools ADD COLUMN upstream_json TEXT;
ALTER TABLE pools ADD COLUMN max_body_bytes BIGINT NOT NULL DEFAULT 10485760;
