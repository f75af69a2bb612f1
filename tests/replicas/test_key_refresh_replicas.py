"""SPEC §5 across replicas: revoking a key refuses its refreshed successors on
every replica within 2 s; retiring a key refuses it alone, everywhere."""

from __future__ import annotations

import time

from support import true_within


def refreshed_everywhere(replicas):
    """A key made on one replica, refreshed on another, and both keys in every
    replica's key cache: (old, new) as the API answered them."""
    a, b, _ = replicas
    old = a.create_key("member", expires_in_seconds=3600)
    with b.client(old["key"]) as client:
        refreshed = client.post("/v1/keys/refresh")
    assert refreshed.status_code == 201, refreshed.text
    new = refreshed.json()
    for replica in replicas:
        for key in (old, new):
            with replica.client(key["key"]) as client:
                assert client.get("/v1/whoami").status_code == 200
    return old, new


def test_revoking_the_old_key_refuses_the_new_one_on_every_replica(replicas):
    c = replicas[2]
    old, new = refreshed_everywhere(replicas)
    with c.client() as admin:
        assert admin.delete(f"/v1/keys/{old['id']}").status_code == 200
    revoked_at = time.monotonic()
    for replica in replicas:
        with replica.client(new["key"]) as client:
            assert true_within(lambda c=client: c.get("/v1/whoami").status_code == 401,
                               revoked_at, 2.0), "successor accepted 2 s after (SPEC §5)"


def test_retiring_the_old_key_refuses_it_everywhere_and_keeps_the_new_one(replicas):
    c = replicas[2]
    old, new = refreshed_everywhere(replicas)
    with c.client() as admin:
        retired = admin.post(f"/v1/keys/{old['id']}/retire")
    assert retired.status_code == 200 and retired.json()["state"] == "retired", retired.text
    retired_at = time.monotonic()
    for replica in replicas:
        with replica.client(old["key"]) as client:
            assert true_within(lambda c=client: c.get("/v1/whoami").status_code == 401,
                               retired_at, 2.0), "retired key accepted 2 s after (SPEC §5)"
    time.sleep(2.1)  # past every replica's key cache: the successor still works
    for replica in replicas:
        with replica.client(new["key"]) as client:
            assert client.get("/v1/whoami").status_code == 200


def test_a_refresh_that_retires_its_key_on_one_replica_holds_on_the_others(replicas):
    a, b, _ = replicas
    old = a.create_key("member", expires_in_seconds=3600)
    with a.client(old["key"]) as client:
        refreshed = client.post("/v1/keys/refresh", json={"retire_previous": True})
    assert refreshed.status_code == 201, refreshed.text
    done = time.monotonic()
    new = refreshed.json()["key"]
    with b.client(old["key"]) as client:
        assert true_within(lambda: client.get("/v1/whoami").status_code == 401, done, 2.0)
        # A retired key cannot refresh on another replica either (read from the row).
        assert client.post("/v1/keys/refresh").status_code == 401
    with b.client(new) as client:
        assert client.get("/v1/whoami").status_code == 200
