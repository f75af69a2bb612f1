-- Shared locks (SPEC §3.6): several live leases of one lock, one row each,
-- named by its lock token; `mode` says whether the lease excludes all others.
-- Existing rows are the exclusive leases they always were: a held lock stays held.
-- depends: 0008_primitives

ALTER TABLE locks ADD COLUMN mode TEXT NOT NULL DEFAULT 'exclusive';
-- The primary key still starts with (project, key): a lock's leases are one
-- index range, and the fast acquire's "no lease row" test reads only that range.
ALTER TABLE locks DROP CONSTRAINT locks_pkey;
ALTER TABLE locks ADD PRIMARY KEY (project, key, lock_token);
