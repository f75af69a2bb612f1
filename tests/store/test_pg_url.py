"""PostgreSQL store URLs (store/pg_url.py): both libpq multi-host forms, what
fencepost adds to every connection, the URL handed to the migration tool, and
passwords kept out of what is printed (SPEC §6)."""

from __future__ import annotations

import pytest

from fencepost.store.pg_url import (
    conninfo,
    each_host,
    hosts,
    migration_url,
    parameters,
    redacted,
)


def _words(info: str) -> dict[str, str]:
    return dict(word.split("=", 1) for word in info.split())


@pytest.mark.parametrize("url", [
    "postgresql://fp:pw@db1:5450,db2:5451/locks",
    "postgresql://fp:pw@/locks?host=db1,db2&port=5450,5451",
    "postgres://fp:pw@db1:5450,db2:5451/locks",
])
def test_both_multi_host_forms_read_alike(url: str) -> None:
    params = parameters(url)
    assert hosts(params) == ["db1", "db2"]
    assert params["port"] == "5450,5451"
    assert params["dbname"] == "locks" and params["user"] == "fp" and params["password"] == "pw"


def test_several_hosts_connect_only_to_a_primary_unless_told_otherwise() -> None:
    assert _words(conninfo("postgresql://u@a:1,b:2/d"))["target_session_attrs"] == "read-write"
    told = _words(conninfo("postgresql://u@a:1,b:2/d?target_session_attrs=primary"))
    assert told["target_session_attrs"] == "primary"
    assert "target_session_attrs" not in _words(conninfo("postgresql://u@a:1/d"))


def test_keepalives_are_added_and_the_operators_own_win() -> None:
    words = _words(conninfo("postgresql://u@a/d?keepalives_idle=30"))
    assert words["keepalives"] == "1" and words["keepalives_idle"] == "30"
    assert words["tcp_user_timeout"] == "10000"


def test_the_migration_url_carries_every_parameter_to_yoyo() -> None:
    from yoyo.connections import parse_uri

    uri = parse_uri(migration_url("postgresql://fp:p%40ss@db1:5450,db2:5451/locks"))
    assert uri.database == "locks"
    assert uri.args["host"] == "db1,db2" and uri.args["port"] == "5450,5451"
    assert uri.args["password"] == "p@ss" and uri.args["user"] == "fp"
    assert uri.args["target_session_attrs"] == "read-write"


@pytest.mark.parametrize(("url", "shown"), [
    ("postgresql://fp:s3cret@db1:5450,db2:5451/locks",
     "postgresql://fp:***@db1:5450,db2:5451/locks"),
    ("postgresql://fp@/locks?host=a,b&password=s3cret&port=1,2",
     "postgresql://fp@/locks?host=a,b&password=***&port=1,2"),
    ("postgresql://fp@db/locks", "postgresql://fp@db/locks"),
    ("sqlite:///fencepost.db", "sqlite:///fencepost.db"),
])
def test_passwords_are_never_shown(url: str, shown: str) -> None:
    assert redacted(url) == shown


@pytest.mark.parametrize("url", [
    "postgresql://u@a/d?nosuchparameter=1",
    "postgresql://u@a/d?sslmode=maybe-not&connect_timeout=x y",
])
def test_a_url_libpq_cannot_read_is_a_value_error(url: str) -> None:
    with pytest.raises(ValueError, match="libpq"):
        parameters(url)


@pytest.mark.parametrize("url", [
    "postgresql://u:pw@h1:5432,h2:5433/db?sslmode=prefer",
    "postgresql://u:pw@/db?host=h1,h2&port=5432,5433&sslmode=prefer",
])
def test_each_host_of_a_multi_host_url_is_its_own_connection_string(url: str) -> None:
    """What the store asks host by host when libpq's choice is behind: each
    keeps every other parameter, and asks nothing of the session's role (the
    store judges the answer itself)."""
    found = [parameters(one) for one in each_host(conninfo(url))]
    assert [(p["host"], p["port"]) for p in found] == [("h1", "5432"), ("h2", "5433")]
    for one in found:
        assert one["user"] == "u" and one["password"] == "pw" and one["dbname"] == "db"
        assert one["sslmode"] == "prefer" and one["keepalives"] == "1"
        assert "target_session_attrs" not in one


def test_each_host_takes_one_port_for_all_and_nothing_from_one_host() -> None:
    found = [parameters(one) for one in each_host(conninfo("postgresql://u@/db?host=a,b,c&port=6000"))]
    assert [(p["host"], p["port"]) for p in found] == [("a", "6000"), ("b", "6000"), ("c", "6000")]
    addressed = each_host(conninfo("postgresql://u@/db?host=a,b&hostaddr=10.0.0.1,10.0.0.2"))
    assert [parameters(one)["hostaddr"] for one in addressed] == ["10.0.0.1", "10.0.0.2"]
    assert each_host(conninfo("postgresql://u@h1:5432/db")) == []
