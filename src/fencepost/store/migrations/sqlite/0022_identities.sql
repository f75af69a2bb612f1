-- Callers from an identity provider (SPEC §5.1): a JWT caller's id is "jwt:"
-- plus its sub, and has no row in api_keys. This table keeps the name its
-- token gave (the name or email claim), so that holders, lines and slot
-- listings name it as they name a key; and the API key it last came through
-- when an application acted for it. Written when a process first sees the
-- caller, and again when the name changes or an hour has passed.
-- depends: 0021_pool_upstreams

CREATE TABLE identities (
    project     TEXT NOT NULL,
    id          TEXT NOT NULL,
    name        TEXT,
    app_key_id  TEXT,
    seen_ms     INTEGER NOT NULL,
    PRIMARY KEY (project, id)
);
CREATE INDEX identities_by_seen ON identities (seen_ms);
