-- Tickets in the locks' lines from a sequence, so that joins of different
-- lines, on any replica, commit concurrently instead of taking turns at the
-- counter row. A ticket is drawn while the batch holds the keys of every line
-- it joins (after every earlier join of those lines committed), so in each
-- line ticket order stays arrival order; one number per waiter across all its
-- lines keeps lock sets free of deadlock.
-- depends: 0013_pool_version

CREATE SEQUENCE lock_tickets AS BIGINT MINVALUE 1;
-- Carry on above every ticket the counter row drew (the row stays, unused),
-- so waiters already in line keep their places ahead of new ones.
DO $$ BEGIN
    PERFORM setval('lock_tickets', GREATEST(value, 1)) FROM counters WHERE name = 'lock_ticket';
END $$;
