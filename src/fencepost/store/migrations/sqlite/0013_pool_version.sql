-- A pool's admission version (store/sql/pools.py): a new random number each
-- time a write changes what admission is decided on (its configuration, what
-- its governor learned), so a writer that remembers a pool as of a version can
-- admit by one guarded insert while the row still has that version. Random,
-- not counted: a version written by a transaction that rolled back must never
-- name another state later. Existing rows start at 0, each a state of its own.
-- Numbered as on PostgreSQL (0012 there is its token sequence, which SQLite
-- has no need of).
-- depends: 0011_sessions

ALTER TABLE pools ADD COLUMN admission_version INTEGER NOT NULL DEFAULT 0;
