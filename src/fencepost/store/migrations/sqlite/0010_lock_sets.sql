-- Lock sets (SPEC §3.7): a waiting set has one ticket and a row in every
-- key's line under it, so the ticket no longer names one row. Tickets come
-- from the 'lock_ticket' counter (drawn inside the serialised write batch, so
-- they still only grow: ticket order is arrival order across every line,
-- which is what makes waiting sets deadlock-free), starting above every
-- ticket AUTOINCREMENT ever gave out. `mode` puts shared and exclusive
-- waiters in one line (SPEC §3.6). Waiters in line keep their places.
-- depends: 0009_shared_leases

INSERT INTO counters (name, value)
SELECT 'lock_ticket', MAX(
    COALESCE((SELECT seq FROM sqlite_sequence WHERE name = 'lock_waiters'), 0),
    COALESCE((SELECT MAX(ticket) FROM lock_waiters), 0));
CREATE TABLE lock_waiters_by_ticket (
    ticket         INTEGER NOT NULL,
    project        TEXT NOT NULL,
    key            TEXT NOT NULL,
    lock_token     TEXT NOT NULL,
    alive_until_ms INTEGER NOT NULL,
    replica        TEXT,
    key_id         TEXT,
    since_ms       INTEGER,
    gives_up_ms    INTEGER,
    mode           TEXT NOT NULL DEFAULT 'exclusive',
    PRIMARY KEY (ticket, key)
) WITHOUT ROWID;
INSERT INTO lock_waiters_by_ticket (ticket, project, key, lock_token, alive_until_ms, replica,
    key_id, since_ms, gives_up_ms, mode)
SELECT ticket, project, key, lock_token, alive_until_ms, replica, key_id, since_ms, gives_up_ms,
    'exclusive' FROM lock_waiters;
DROP TABLE lock_waiters;
ALTER TABLE lock_waiters_by_ticket RENAME TO lock_waiters;
CREATE INDEX lock_waiters_line ON lock_waiters (project, key, ticket);
CREATE INDEX lock_waiters_by_life ON lock_waiters (alive_until_ms);
