-- Lock sets (SPEC §3.7): a waiting set has one ticket and a row in every
-- key's line under it, so the ticket no longer names one row. Tickets come
-- from the 'lock_ticket' counter (drawn inside the serialised write batch, so
-- they still only grow: ticket order is arrival order across every line,
-- which is what makes waiting sets deadlock-free). `mode` puts shared and
-- exclusive waiters in one line (SPEC §3.6). Waiters in line keep their places.
-- depends: 0009_shared_leases

ALTER TABLE lock_waiters ADD COLUMN mode TEXT NOT NULL DEFAULT 'exclusive';
INSERT INTO counters (name, value)
SELECT 'lock_ticket', GREATEST(
    (SELECT last_value FROM lock_waiters_ticket_seq),
    COALESCE((SELECT MAX(ticket) FROM lock_waiters), 0));
ALTER TABLE lock_waiters ALTER COLUMN ticket DROP DEFAULT;
DROP SEQUENCE lock_waiters_ticket_seq;
ALTER TABLE lock_waiters DROP CONSTRAINT lock_waiters_pkey;
ALTER TABLE lock_waiters ADD PRIMARY KEY (ticket, key);
