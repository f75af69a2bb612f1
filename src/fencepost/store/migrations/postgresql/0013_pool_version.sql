-- A pool's admission version (store/sql/pools.py): a new random number each
-- time a write changes what admission is decided on (its configuration, what
-- its governor learned), so a writer that remembers a pool as of a version can
-- admit by one guarded insert while the row still has that version. Random,
-- not counted: a version written by a transaction that rolled back must never
-- name another state later. Existing rows start at 0, each a state of its own.
-- depends: 0012_token_sequence

ALTER TABLE pools ADD COLUMN admission_version BIGINT NOT NULL DEFAULT 0;
