"""PostgreSQL store URLs: the forms an operator may write, and what fencepost
asks of every connection it makes from them (SPEC §6, "Highly available
PostgreSQL").

libpq names several servers in two ways, and fencepost takes both:

- `postgresql://u@h1:5432,h2:5433/db` (hosts and ports in the authority);
- `postgresql://u@/db?host=h1,h2&port=5432,5433` (query parameters).

Python's `urlsplit` cannot read a port from the first form, so nothing here
splits URLs by hand: libpq's own parser (through psycopg) turns either into
keyword parameters, and fencepost adds its own beside the operator's:

- with several hosts, `target_session_attrs=read-write` unless the URL says
  otherwise, so that no connection (a reader's included) lands on a standby;
- TCP keepalives and a TCP user timeout, so that a connection whose peer
  vanished without a reset (a crashed machine, a partition that drops
  packets) is found dead within seconds instead of the kernel's two hours.
  An operator's own values in the URL win.
"""

from __future__ import annotations

from urllib.parse import quote, urlencode

from psycopg.conninfo import conninfo_to_dict, make_conninfo

# Found dead after about 5 + 3 x 2 = 11 s of silence, and unacknowledged
# writes after 10 s; the store timeout (SPEC §7.10) answers callers well before.
_TCP_DEFAULTS = {
    "keepalives": "1",
    "keepalives_idle": "5",
    "keepalives_interval": "2",
    "keepalives_count": "3",
    "tcp_user_timeout": "10000",
}


def parameters(url: str) -> dict[str, str]:
    """The URL's connection parameters as libpq reads them (either multi-host
    form); raises ValueError for one libpq cannot read."""
    try:
        parsed = conninfo_to_dict(_scheme(url))
    except Exception as exc:  # psycopg.ProgrammingError: libpq's own message
        raise ValueError(f"{_redact_text(url)!r} is not a PostgreSQL URL libpq can read: "
                         f"{exc}") from None
    return {name: str(value) for name, value in parsed.items() if value is not None}


def hosts(params: dict[str, str]) -> list[str]:
    """The servers the parameters name, in order (empty: libpq's default)."""
    return [host for host in params.get("host", "").split(",") if host]


def conninfo(url: str) -> str:
    """The libpq connection string fencepost connects with (see the module's
    docstring for what it adds)."""
    params = parameters(url)
    added: dict[str, str] = {}
    if len(hosts(params)) > 1 and "target_session_attrs" not in params:
        added["target_session_attrs"] = "read-write"
    for name, value in _TCP_DEFAULTS.items():
        if name not in params:
            added[name] = value
    return make_conninfo("", **params, **added)


def each_host(conninfo_text: str) -> list[str]:
    """One connection string per server a multi-host connection string
    names, in its order (libpq's rules: `port` and `hostaddr` give one value
    for every host, or one for each); empty for a single server. Used to
    look past the server libpq chose to the others (postgresql.py)."""
    params = parameters(conninfo_text)
    names = params.get("host", "").split(",")
    if len(names) < 2:
        return []

    def per_host(name: str) -> list[str]:
        values = params.get(name, "").split(",")
        return values * len(names) if len(values) == 1 else values

    ports, addresses = per_host("port"), per_host("hostaddr")
    if len(ports) != len(names) or len(addresses) != len(names):
        return []  # libpq refuses such a string; nothing to look past
    single = {name: value for name, value in params.items()
              if name not in ("host", "port", "hostaddr", "target_session_attrs")}
    found = []
    for name, port, address in zip(names, ports, addresses, strict=True):
        one = {"host": name, **({"port": port} if port else {}),
               **({"hostaddr": address} if address else {})}
        found.append(make_conninfo("", **single, **one))
    return found


def migration_url(url: str) -> str:
    """The URL yoyo (the migration tool) connects with: the database in the
    path, every other parameter in the query, which yoyo hands to psycopg as
    keywords. Either multi-host form arrives as `host=h1,h2&port=...`."""
    params = dict(parameters(conninfo(url)))
    database = params.pop("dbname", "")
    return f"postgresql+psycopg:///{quote(database, safe='')}?{urlencode(params)}"


def redacted(url: str) -> str:
    """The URL with any password replaced, in the authority or the query."""
    return _redact_text(url)


def _redact_text(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    authority, slash, tail = rest.partition("/")
    if "@" in authority:
        userinfo, _, where = authority.rpartition("@")
        if ":" in userinfo:
            user = userinfo.split(":", 1)[0]
            authority = f"{user}:***@{where}"
    query_at = tail.find("?")
    if query_at >= 0:
        pairs = tail[query_at + 1:].split("&")
        tail = tail[:query_at + 1] + "&".join(
            "password=***" if pair.lower().startswith("password=") else pair for pair in pairs
        )
    return f"{scheme}{sep}{authority}{slash}{tail}"


def _scheme(url: str) -> str:
    """postgres:// and postgresql:// both name the same thing to libpq."""
    if url.startswith("postgres://"):
        return "postgresql://" + url[len("postgres://"):]
    return url
