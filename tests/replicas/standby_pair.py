"""A primary and an asynchronous standby of a test's own (tests/pg_private.py),
the standby streaming through a relay that the test holds, so that the
standby is really behind when it is promoted (tests/replicas/test_failover.py,
test_deposed_primary.py)."""

from __future__ import annotations

from pathlib import Path

from pg_private import PrivatePostgres, Relay

from support import faketime_library, wait_until


class Pair:
    def __init__(self, root: Path, standby_clock: str | None = None) -> None:
        self.primary = PrivatePostgres(root / "primary")
        self.primary.start()
        self.relay = Relay(self.primary.port)
        self.standby = PrivatePostgres(root / "standby", standby_of=self.primary)
        # The standby streams through the relay, not straight from the primary.
        with open(self.standby.data / "postgresql.auto.conf", "a") as conf:
            conf.write(f"primary_conninfo = 'host=127.0.0.1 port={self.relay.port} "
                       f"user=postgres application_name=standby'\n")
        self.standby_env = {}
        if standby_clock is not None:
            self.standby_env = {"LD_PRELOAD": faketime_library(multithreaded=True),
                                "FAKETIME": standby_clock, "FAKETIME_DONT_RESET": "1"}
        self.standby.start(env=self.standby_env)
        wait_until(lambda: self.primary.sql(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'")[0][0] == 1,
            "the standby streams", timeout=30)

    @property
    def url(self) -> str:
        """libpq's multi-host form: the primary first, the standby second
        (target_session_attrs=read-write is fencepost's default with several)."""
        return (f"postgresql://postgres@127.0.0.1:{self.primary.port},"
                f"127.0.0.1:{self.standby.port}/postgres")

    def fail_over(self) -> None:
        """The primary dies with what the standby has not received; the standby
        is promoted (what Patroni or pg_auto_failover would do)."""
        self.primary.kill9()
        self.relay.cut()
        self.standby.promote()

    def stop(self) -> None:
        self.relay.cut()
        self.primary.stop()
        self.standby.stop()
