-- Ended leases indexed by fencing token first. The index of 0008 led with the
-- lock's name, so every ended lease (every release, under fresh keys) went to
-- a random place in it: a page written per ended lease at every commit, most
-- of what recording the ends cost. Tokens are drawn in grant order, so leases
-- mostly end near the index's newest edge. A fence check looks a token up
-- within the asking lock: the index carries the table's key columns after the
-- token (the table is WITHOUT ROWID). Naming them in the index as well makes
-- SQLite's planner prefer a scan of the lock's ended leases by primary key.
-- depends: 0013_pool_version

CREATE INDEX ended_leases_by_fencing ON ended_leases (fencing_token);
DROP INDEX ended_leases_by_token;
