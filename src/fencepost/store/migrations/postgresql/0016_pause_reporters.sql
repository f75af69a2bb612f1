-- Whose report a pool's pause rests on (SPEC §4.5): one holder's report alone
-- pauses a pool for at most a minute; a longer pause needs a second holder's
-- evidence. The reporter is the releasing slot's key; the claim is when that
-- reporter said the upstream's budget refills.
-- depends: 0015_ended_by_fencing

ALTER TABLE pools ADD COLUMN pause_reporter TEXT;
ALTER TABLE pools ADD COLUMN pause_claim_ms BIGINT NOT NULL DEFAULT 0;
