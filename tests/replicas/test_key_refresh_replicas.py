"""SPEC §5 across replicas: revoking a key refuses its refreshed successors on
every replica within 2 s."""

from __future__ import annotations

import time

from support import true_within


def test_revoking_the_old_key_refuses_the_new_one_on_every_replica(replicas):
    a, b, c = replicas
    old = a.create_key("member", expires_in_seconds=3600)
    with b.client(old["key"]) as client:
        refreshed = client.post("/v1/keys/refresh")
    assert refreshed.status_code == 201, refreshed.text
    new = refreshed.json()
    for replica in replicas:  # warm every replica's key cache with both keys
        for key in (old, new):
            with replica.client(key["key"]) as client:
                assert client.get("/v1/whoami").status_code == 200
    with c.client() as admin:
        assert admin.delete(f"/v1/keys/{old['id']}").status_code == 200
    revoked_at = time.monotonic()
    for replica in replicas:
        with replica.client(new["key"]) as client:
            assert true_within(lambda c=client: c.get("/v1/whoami").status_code == 401,
                               revoked_at, 2.0), "successor accepted 2 s after (SPEC §5)"
