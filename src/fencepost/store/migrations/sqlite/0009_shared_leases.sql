-- Shared locks (SPEC §3.6): several live leases of one lock, one row each,
-- named by its lock token; `mode` says whether the lease excludes all others.
-- Existing rows are the exclusive leases they always were: a held lock stays held.
-- SQLite cannot change a primary key in place: the table is rebuilt.
-- depends: 0008_primitives

CREATE TABLE locks_by_token (
    project       TEXT NOT NULL,
    key           TEXT NOT NULL,
    lock_token    TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    acquired_ms   INTEGER NOT NULL,
    expires_ms    INTEGER NOT NULL,
    deadline_ms   INTEGER NOT NULL,
    dies_ms       INTEGER NOT NULL,
    operation     TEXT,
    metadata      TEXT,
    on_expiry     TEXT NOT NULL,
    key_id        TEXT,
    lock_delay_ms BIGINT NOT NULL DEFAULT 0,
    mode          TEXT NOT NULL DEFAULT 'exclusive',
    PRIMARY KEY (project, key, lock_token)
) WITHOUT ROWID;
INSERT INTO locks_by_token (project, key, lock_token, fencing_token, acquired_ms, expires_ms,
    deadline_ms, dies_ms, operation, metadata, on_expiry, key_id, lock_delay_ms, mode)
SELECT project, key, lock_token, fencing_token, acquired_ms, expires_ms, deadline_ms, dies_ms,
    operation, metadata, on_expiry, key_id, lock_delay_ms, 'exclusive' FROM locks;
DROP TABLE locks;
ALTER TABLE locks_by_token RENAME TO locks;
CREATE INDEX locks_by_death ON locks (dies_ms);
