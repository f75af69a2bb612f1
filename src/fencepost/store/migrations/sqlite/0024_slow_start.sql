-- Slow start (SPEC §4.5): an adaptive pool that knows nothing of its upstream
-- yet (new, or whose evidence went stale) starts low and doubles its limit
-- each round trip while calls succeed, until the first throttle or its
-- configured limit. Whether the pool is still in that phase.
-- depends: 0023_pool_costs

ALTER TABLE pools ADD COLUMN gov_slow_start INTEGER NOT NULL DEFAULT 0;
