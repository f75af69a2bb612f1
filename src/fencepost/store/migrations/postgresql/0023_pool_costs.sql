-- Unit budgets (SPEC §4.6): a pool's configured budget of units (tokens) per
-- minute; its GCRA clock for units (when every unit admitted so far has
-- refilled), the running average of what calls cost (charged to calls that
-- declare none), and the budget the upstream's headers stated. A slot keeps
-- what it was charged, so that a release reporting the real cost can settle
-- the difference.
-- depends: 0022_identities

ALTER TABLE pools ADD COLUMN cost_per_minute BIGINT;
ALTER TABLE pools ADD COLUMN cost_tat_ms DOUBLE PRECISION NOT NULL DEFAULT 0;
ALTER TABLE pools ADD COLUMN avg_cost DOUBLE PRECISION;
ALTER TABLE pools ADD COLUMN learned_cost_per_minute BIGINT;
ALTER TABLE slots ADD COLUMN cost BIGINT;
