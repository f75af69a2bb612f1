-- Ended leases indexed by fencing token first. The index of 0008 led with the
-- lock's name, so every ended lease (every release, under fresh keys) went to
-- a random place in it: a page written per ended lease at every commit, most
-- of what recording the ends cost. Tokens are drawn in grant order, so leases
-- mostly end near the index's newest edge. A fence check looks a token up by
-- all three columns (a token names one lease store-wide; the name columns keep
-- the lookup within the asking lock).
-- depends: 0014_ticket_sequence

CREATE INDEX ended_leases_by_fencing ON ended_leases (fencing_token, project, key);
DROP INDEX ended_leases_by_token;
