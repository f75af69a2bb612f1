-- Per-key request quotas, shared by every server on the store (SPEC §2 "Quota").
-- depends: 0002_pools

-- GCRA state: the theoretical arrival time of the next request, epoch ms.
CREATE TABLE key_quota (
    key_id                 TEXT PRIMARY KEY,
    theoretical_arrival_ms DOUBLE PRECISION NOT NULL
);
