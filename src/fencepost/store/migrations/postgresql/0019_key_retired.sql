-- A key retired (SPEC §5, POST /v1/keys/{id}/retire): it stops working, and the
-- keys refreshed from it do not (revocation, revoked_ms, takes them too).
-- depends: 0018_compact_ended

ALTER TABLE api_keys ADD COLUMN retired_ms BIGINT;
