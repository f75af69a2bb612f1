-- Sessions (SPEC §3.10): one heartbeat for many leases and slots.
-- depends: 0010_lock_sets

-- One row per session, kept after it ends (for a day, like ended_leases) so a
-- late renewal learns why it lost. `owner_root` is the first key of the
-- creating key's refresh chain: the session belongs to that key and to every
-- key refreshed from it, so a worker that swaps keys keeps its session.
CREATE TABLE sessions (
    id           TEXT PRIMARY KEY,
    project      TEXT NOT NULL,
    key_id       TEXT,
    owner_root   TEXT NOT NULL,
    name         TEXT,
    ttl_ms       INTEGER NOT NULL,
    created_ms   INTEGER NOT NULL,
    expires_ms   INTEGER NOT NULL,
    ended_reason TEXT,
    ended_ms     INTEGER
) WITHOUT ROWID;
-- The reaper finds expired live sessions, and forgets old ended ones, by these.
CREATE INDEX sessions_live_by_expiry ON sessions (expires_ms) WHERE ended_reason IS NULL;
CREATE INDEX sessions_by_end ON sessions (ended_ms);

-- Leases and slots attached to a session: their expiry is kept equal to the
-- session's, and renewing or ending the session updates them by this index.
ALTER TABLE locks ADD COLUMN session_id TEXT;
CREATE INDEX locks_by_session ON locks (session_id) WHERE session_id IS NOT NULL;
ALTER TABLE slots ADD COLUMN session_id TEXT;
CREATE INDEX slots_by_session ON slots (session_id) WHERE session_id IS NOT NULL;
