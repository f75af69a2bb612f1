"""`fencepost run --lock KEY -- CMD` / `fencepost run --pool POOL -- CMD`: hold a
lock or a pool slot exactly while a command runs.

- The lease is renewed in the background and released when CMD ends (whatever
  way it ends); fencepost then exits with CMD's exit code (128+N when CMD was
  killed by signal N).
- CMD gets FENCEPOST_LOCK_KEY and FENCEPOST_FENCING_TOKEN (or FENCEPOST_POOL and
  FENCEPOST_SLOT_ID) in its environment, and not fencepost's own credentials
  (`CREDENTIAL_VARIABLES`) unless --pass-credentials is given: CMD may be any
  code, and the key fencepost holds may be an admin key.
- Signals sent to fencepost are forwarded to CMD. On a terminal, CMD stays in
  the terminal's foreground, so Ctrl-C reaches it directly and is not sent twice.
  Elsewhere (cron, CI) CMD runs in a process group of its own, and signals and
  the lease-loss stop go to that whole group, so CMD's children stop too.
- CMD never outlives the lease: when the lease is lost, or when renewals keep
  failing, CMD (its process group) gets SIGTERM, then SIGKILL after --grace
  seconds, and fencepost exits 4. The SIGKILL comes before the lease could
  expire on the server (`fencepost.cli.stopping` says when), so the next holder
  never finds CMD still running.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from typing import Any, TypeVar

import click

from fencepost.cli.common import CliFailure, Ctx, api_command, connection_options
from fencepost.cli.exitcodes import ExitCode
from fencepost.cli.params import JSON_OBJECT, NAME, Seconds
from fencepost.cli.progress import ProgressLine, lock_waiting, slot_waiting, while_waiting
from fencepost.cli.stopping import (
    MIN_LOCK_WINDOW_S,
    SLOT_WINDOW_INTERVALS,
    StopSchedule,
    choose_grace,
    margin_for,
)
from fencepost.client import AsyncClient
from fencepost.client.aio import (
    AsyncAttachedLockSet,
    AsyncLockHold,
    AsyncLockSetHold,
    AsyncSessionHold,
    AsyncSlotHold,
)
from fencepost.client.keeper import Loss
from fencepost.client.models import Lease
from fencepost.core.sessions import SESSION_TTL_MAX_SECONDS, SESSION_TTL_MIN_SECONDS
from fencepost.errors import FencepostError, LockHeld, QueueTimeout, TooManyRequests

T = TypeVar("T")

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT,
             signal.SIGUSR1, signal.SIGUSR2)
TERMINAL_SIGNALS = (signal.SIGINT, signal.SIGQUIT)
# sysexits EX_TEMPFAIL: CMD says "temporarily failed, try later" -> reported as a 429.
EX_TEMPFAIL = 75
# An acquire answered later than this after it was sent (it waited in line) is
# followed at once by a renewal: only a send time bounds the lease's end.
SLOW_GRANT_S = 1.0
MIN_REQUEST_TIMEOUT_S = 1.0
# Variables whose value is a fencepost secret: the API key the client reads,
# and the server's bootstrap (admin) key, metrics key and store URL (which may
# hold a database password), should the same environment serve both. CMD
# gets none of them without --pass-credentials. (FENCEPOST_URL,
# FENCEPOST_CA_BUNDLE and FENCEPOST_TLS_* are not secrets: an address, and
# paths of files.)
CREDENTIAL_VARIABLES = ("FENCEPOST_API_KEY", "FENCEPOST_BOOTSTRAP_KEY", "FENCEPOST_METRICS_KEY",
                        "FENCEPOST_STORE")


def _terminal_foreground() -> bool:
    """Whether we run in the foreground of a controlling terminal (so the terminal
    sends Ctrl-C to our whole process group)."""
    try:
        fd = os.open("/dev/tty", os.O_RDONLY | os.O_NOCTTY)
    except OSError:
        return False
    try:
        return os.tcgetpgrp(fd) == os.getpgrp()
    except OSError:
        return False
    finally:
        os.close(fd)


def _exit_code_of(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def _slot_outcome_status(returncode: int) -> int:
    if returncode == 0:
        return 200
    if returncode == EX_TEMPFAIL:
        return 429
    return 500


@click.command(context_settings={"allow_interspersed_args": False})
@click.option("--lock", "lock_keys", type=NAME, multiple=True,
              help="Hold this lock; repeat it to hold several at once, all or none.")
@click.option("--shared", is_flag=True, default=False,
              help="Hold the lock(s) shared (a reader): others with --shared may hold "
                   "them too, nobody exclusively.")
@click.option("--pool", "pool_name", type=NAME, default=None, help="Hold a slot of this pool.")
@click.option("--cost", type=click.IntRange(0, 10**9), default=None, metavar="UNITS",
              help="With --pool: the units (tokens) CMD will spend of the pool's budget "
                   "[default: the pool's average].")
@click.option("--ttl", type=click.IntRange(5, 7_776_000), default=60, show_default=True,
              metavar="SECONDS", help="Lock lease length; renewed every third of it.")
@click.option("--session-ttl", type=click.IntRange(SESSION_TTL_MIN_SECONDS,
                                                 SESSION_TTL_MAX_SECONDS),
              default=None, metavar="SECONDS",
              help="Hold the locks (--lock, repeated) on one session of this TTL: one "
                   "renewal every third of it keeps them all; --ttl is then unused.")
@click.option("--wait", type=Seconds(min=0), default=0, show_default=True,
              metavar="SECONDS", help="How long to wait for the lock or slot; 0 fails fast.")
@click.option("--operation", default=None,
              help="What CMD does, shown to others who find the lock busy "
                   "[default: CMD's name].")
@click.option("--metadata", type=JSON_OBJECT, default=None,
              help="JSON object of holder details (host and pid are added).")
@click.option("--grace", type=Seconds(0, 3600), default=None, metavar="SECONDS",
              help="When CMD must stop: time between SIGTERM and SIGKILL, which must fit "
                   "in the lease [default: 10, or less to fit].")
@click.option("--busy-exit-code", type=click.IntRange(0, 255), default=int(ExitCode.BUSY),
              show_default=True, help="Exit code when the lock or slot is not free in time "
                                      "(0 makes a busy cron run a quiet no-op).")
@click.option("--pass-credentials", is_flag=True, default=False,
              help="Leave fencepost's credentials (" + ", ".join(CREDENTIAL_VARIABLES)
                   + ") in CMD's environment. Without it they are removed: CMD may be "
                     "any code, and an API key (perhaps an admin key) must not leak "
                     "into it.")
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@connection_options
@api_command
async def run(ctx: Ctx, lock_keys: tuple[str, ...], shared: bool, pool_name: str | None,
              cost: int | None, ttl: int, session_ttl: int | None, wait: float,
              operation: str | None,
              metadata: dict[str, Any] | None,
              grace: float | None, busy_exit_code: int, pass_credentials: bool,
              command: tuple[str, ...]) -> int:
    """Run CMD while holding a lock (--lock KEY), several locks at once
    (--lock A --lock B: all or none, without deadlock; with --session-ttl on
    one session, renewed once for them all), or a pool slot (--pool POOL).

    \b
    fencepost run --lock nightly-backup --ttl 120 -- ./backup.sh
    fencepost run --lock reports --shared -- ./read-reports.sh
    fencepost run --lock db-a --lock db-b -- ./migrate.sh
    fencepost run --lock db-a --lock db-b --session-ttl 30 -- ./migrate.sh
    fencepost run --pool upstream-api --wait 60 -- python call_api.py

    CMD gets FENCEPOST_LOCK_KEY and FENCEPOST_FENCING_TOKEN (one lock), or
    FENCEPOST_LOCK_KEYS and FENCEPOST_FENCING_TOKENS (several: `key=token`
    pairs, comma-separated), or FENCEPOST_POOL and FENCEPOST_SLOT_ID, with the
    rest of fencepost's environment except its credentials: FENCEPOST_API_KEY
    (and the server's FENCEPOST_BOOTSTRAP_KEY, FENCEPOST_METRICS_KEY and
    FENCEPOST_STORE) reach CMD only with --pass-credentials. CMD may be any
    code, and fencepost's key, perhaps an admin key, must not leak into it.

    Exits with CMD's exit code. Before CMD runs: 3 (or --busy-exit-code) when
    the lock or slot is not free in time, and the codes of other commands for
    other failures; 4 when the lease was lost, or could not be renewed in time,
    while CMD ran (CMD was stopped before the lease could expire); 127 / 126
    when CMD cannot be found / executed.
    """
    if bool(lock_keys) == (pool_name is not None):
        raise CliFailure("give exactly one of --lock KEY (repeated for several locks) and "
                         "--pool POOL.", ExitCode.USAGE)
    if shared and pool_name is not None:
        raise CliFailure("--shared is for locks, not pools.", ExitCode.USAGE)
    if cost is not None and pool_name is None:
        raise CliFailure("--cost is for a pool's slot (--pool POOL).", ExitCode.USAGE)
    if session_ttl is not None:
        if len(lock_keys) < 2:
            raise CliFailure("--session-ttl is for several locks (--lock A --lock B ...).",
                             ExitCode.USAGE)
        ttl = session_ttl  # the leases follow the session: its TTL is what is renewed
    renew_every: float | None = None
    if lock_keys:
        try:
            grace = choose_grace(grace, ttl, MIN_LOCK_WINDOW_S)
        except ValueError as exc:
            raise CliFailure(f"{exc}; raise --ttl or lower --grace.", ExitCode.USAGE) from None
        # Three renewals between a grant and the stop, and no renewal waits for
        # its answer longer than the time between two (or 1 s), so a lost one
        # is retried in time. The stop itself never waits for a renewal.
        renew_every = (ttl - grace - margin_for(ttl)) / 3
    timeout = None if renew_every is None else max(renew_every, MIN_REQUEST_TIMEOUT_S)
    runner = _Runner(ctx, list(command), grace, ttl, pass_credentials)
    client = ctx.client(timeout=timeout, on_renewed=runner.renewed)
    async with client:
        hold: Hold
        if lock_keys:
            details = {"host": os.uname().nodename, "pid": os.getpid(), **(metadata or {})}
            options: dict[str, Any] = dict(
                ttl=ttl, wait=wait, raise_on_loss=False, metadata=details, shared=shared,
                operation=(operation or os.path.basename(command[0]) or "run")[:64],
                renew_every=renew_every,
            )
            if session_ttl is not None:
                hold = _SessionLocks(client, lock_keys, session_ttl, options)
            elif len(lock_keys) == 1:
                hold = client.lock(lock_keys[0], **options)
            else:
                hold = client.lock_many(lock_keys, **options)
        else:
            hold = client.slot(pool_name or "", wait=wait, raise_on_loss=False, cost=cost)
        return await runner.run(client, hold, busy_exit_code)


class _SessionLocks:
    """Several locks attached to one session (`--session-ttl`): the session's
    heartbeat is the only renewal, and its loss is the locks' loss. Leaving
    ends the session, and with it every lock at once."""

    def __init__(self, client: AsyncClient, keys: tuple[str, ...], session_ttl: int,
                 options: dict[str, Any]) -> None:
        self.session: AsyncSessionHold = client.session(
            ttl=session_ttl, renew_every=options["renew_every"], raise_on_loss=False,
        )
        self.keys = sorted(set(keys))
        self._options = {name: options[name]
                         for name in ("wait", "operation", "metadata", "shared")}
        self._locks: AsyncAttachedLockSet | None = None

    async def __aenter__(self) -> _SessionLocks:
        await self.session.__aenter__()
        try:
            self._locks = self.session.lock_many(self.keys, **self._options)
            await self._locks.__aenter__()
        except BaseException:
            await self.session.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.session.__aexit__(None, None, None)

    @property
    def _held(self) -> AsyncAttachedLockSet:
        assert self._locks is not None, "used before the locks were taken"
        return self._locks

    @property
    def leases(self) -> list[Lease]:
        return self._held.leases

    @property
    def fencing_tokens(self) -> dict[str, int]:
        return self._held.fencing_tokens

    @property
    def lost_event(self) -> asyncio.Event:
        return self.session.lost_event

    @property
    def loss(self) -> Loss | None:
        return self.session.loss

    @property
    def lost(self) -> bool:
        return self.session.lost


Hold = AsyncLockHold | AsyncLockSetHold | _SessionLocks | AsyncSlotHold


class _Runner:
    """Holds the lease, runs CMD, and relays signals between the two."""

    def __init__(self, ctx: Ctx, argv: list[str], grace: float | None, ttl: int,
                 pass_credentials: bool = False) -> None:
        self.ctx = ctx
        self.argv = argv
        self.pass_credentials = pass_credentials
        self.ttl = ttl  # of a lock lease
        self.grace = grace  # None: the default, chosen to fit a slot's term
        self.schedule: StopSchedule | None = None
        self.foreground = _terminal_foreground()
        self.verbose = ProgressLine().enabled
        self.child: asyncio.subprocess.Process | None = None
        self.stop_signal: int | None = None
        self.main_task: asyncio.Task[Any] | None = None
        self.acquiring = False

    def renewed(self, sent: float) -> None:
        if self.schedule is not None:
            self.schedule.granted(sent)

    def say(self, text: str, always: bool = False) -> None:
        if always or self.verbose:
            click.echo(f"fencepost: {text}", err=True)

    async def run(self, client: AsyncClient, hold: Hold,
                  busy_exit_code: int) -> int:
        loop = asyncio.get_running_loop()
        self.main_task = asyncio.current_task()
        for sig in FORWARDED:
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            acquired = await self._acquire(client, hold, busy_exit_code)
            if acquired is not None:
                return acquired
            try:
                return await self._run_child(hold)
            finally:
                await hold.__aexit__(None, None, None)
        finally:
            for sig in FORWARDED:
                loop.remove_signal_handler(sig)

    async def _acquire(self, client: AsyncClient, hold: Hold,
                       busy_exit_code: int) -> int | None:
        if isinstance(hold, AsyncLockHold):
            describe = lock_waiting(client, hold.key)
            what = f"lock {hold.key}"
        elif isinstance(hold, AsyncLockSetHold | _SessionLocks):
            describe = lock_waiting(client, hold.keys[0])
            what = f"locks {', '.join(hold.keys)}"
        else:
            describe = slot_waiting(client, hold.pool)
            what = f"a slot of pool {hold.pool}"
        self.acquiring = True
        sent = time.monotonic()
        try:
            await while_waiting(hold.__aenter__(), describe, ProgressLine())
        except (LockHeld, TooManyRequests, QueueTimeout) as busy:
            self.say(f"{what} is busy: {busy.message}", always=True)
            return busy_exit_code
        except asyncio.CancelledError:
            if self.stop_signal is None:
                raise
            self.say(f"stopped by signal {self.stop_signal} while waiting for {what}",
                     always=True)
            return 128 + self.stop_signal
        finally:
            self.acquiring = False
        if self.stop_signal is not None:
            await hold.__aexit__(None, None, None)
            return 128 + self.stop_signal
        refused = await self._schedule(client, hold, sent)
        if refused is not None:
            await hold.__aexit__(None, None, None)
            return refused
        if isinstance(hold, AsyncLockHold):
            self.say(f"holding lock {hold.key} (fencing token {hold.fencing_token}); "
                     f"running {self.argv[0]}")
        elif isinstance(hold, AsyncLockSetHold | _SessionLocks):
            tokens = ", ".join(f"{k} {t}" for k, t in hold.fencing_tokens.items())
            self.say(f"holding locks (fencing tokens {tokens}); running {self.argv[0]}")
        else:
            self.say(f"holding a slot of pool {hold.pool}; running {self.argv[0]}")
        return None

    async def _schedule(self, client: AsyncClient, hold: Hold,
                        sent: float) -> int | None:
        """Set the stop times of the lease granted by an acquire sent at `sent`;
        an exit code instead when CMD must not start."""
        if not isinstance(hold, AsyncSlotHold):
            lease = hold.lease if isinstance(hold, AsyncLockHold) else hold.leases[0]
            lifetime = (lease.deadline_at - lease.acquired_at).total_seconds()
            assert self.grace is not None  # chosen before acquiring
            self.schedule = StopSchedule(self.ttl, self.grace, sent, sent + lifetime)
        else:
            grant = hold.grant
            term_s = grant.term_ms / 1000
            window = SLOT_WINDOW_INTERVALS * grant.renew_interval_ms / 1000
            try:
                grace = choose_grace(self.grace, term_s, window)
            except ValueError as exc:
                self.say(f"pool {hold.pool}: {exc}.", always=True)
                return int(ExitCode.USAGE)
            request_s = (grant.request_deadline - grant.lease_deadline) / 1000 + term_s
            self.schedule = StopSchedule(term_s, grace, sent, sent + request_s)
        if time.monotonic() - sent > SLOW_GRANT_S:
            # Waited in line: the grant may be much younger than the request.
            # A renewal sent now bounds the lease's end from now.
            with contextlib.suppress(FencepostError):
                if isinstance(hold, AsyncLockHold):
                    await client.renew_lock(hold.key, hold.token, ttl=self.ttl)
                elif isinstance(hold, AsyncLockSetHold):
                    for key in hold.keys:
                        await client.renew_lock(key, hold.token, ttl=self.ttl)
                elif isinstance(hold, _SessionLocks):
                    await client.renew_session(hold.session.session_id, ttl=self.ttl)
                else:
                    await client.renew_slot(hold.pool, hold.slot_id)
        if self.schedule.term_at() <= time.monotonic():
            self.say("the lease could not be renewed in time to run "
                     f"{self.argv[0]} safely; not running it", always=True)
            return int(ExitCode.LOST)
        return None

    def _environment(self, hold: Hold) -> dict[str, str]:
        env = dict(os.environ)
        if not self.pass_credentials:
            for name in CREDENTIAL_VARIABLES:
                env.pop(name, None)
        if isinstance(hold, AsyncLockHold):
            env["FENCEPOST_LOCK_KEY"] = hold.key
            env["FENCEPOST_FENCING_TOKEN"] = str(hold.fencing_token)
        elif isinstance(hold, AsyncLockSetHold | _SessionLocks):
            env["FENCEPOST_LOCK_KEYS"] = ",".join(hold.keys)
            env["FENCEPOST_FENCING_TOKENS"] = ",".join(
                f"{key}={token}" for key, token in hold.fencing_tokens.items())
        else:
            env["FENCEPOST_POOL"] = hold.pool
            env["FENCEPOST_SLOT_ID"] = hold.slot_id
        return env

    async def _run_child(self, hold: Hold) -> int:
        try:
            self.child = await asyncio.create_subprocess_exec(
                *self.argv, env=self._environment(hold),
                process_group=None if self.foreground else 0,
            )
        except FileNotFoundError:
            self.say(f"{self.argv[0]}: command not found", always=True)
            return int(ExitCode.COMMAND_NOT_FOUND)
        except OSError as exc:
            self.say(f"{self.argv[0]}: cannot run it: {exc.strerror or exc}", always=True)
            return int(ExitCode.CANNOT_EXECUTE)
        if self.stop_signal is not None:  # a signal came while CMD was starting
            self._signal_child(self.stop_signal)
        exited = asyncio.ensure_future(self.child.wait())
        lost = asyncio.ensure_future(hold.lost_event.wait())
        schedule = self.schedule
        assert schedule is not None
        try:
            # Until CMD ends, the lease is lost, or the SIGTERM time comes (each
            # renewal that gets through moves it on).
            while not exited.done() and not lost.done():
                left = schedule.term_at() - time.monotonic()
                if left <= 0:
                    break
                await asyncio.wait([exited, lost], timeout=left,
                                   return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not exited.done():
            loss = hold.loss
            if loss is not None:
                self.say(f"the lease was lost ({loss.reason}); stopping {self.argv[0]}",
                         always=True)
            elif schedule.at_cap():
                self.say(f"the lease reaches its deadline; stopping {self.argv[0]} before "
                         "it ends", always=True)
            else:
                self.say(f"the lease could not be renewed; stopping {self.argv[0]} before "
                         "it can expire", always=True)
            await self._stop_child(exited, schedule)
            return int(ExitCode.LOST)
        returncode = exited.result()
        if isinstance(hold, AsyncSlotHold):
            status = _slot_outcome_status(returncode)
            hold.report(status=status, throttled=1 if status == 429 else None)
        if hold.lost:
            self.say(f"the lease was lost ({hold.loss.reason if hold.loss else 'unknown'}) "
                     f"before {self.argv[0]} ended", always=True)
            return int(ExitCode.LOST)
        return _exit_code_of(returncode)

    async def _stop_child(self, exited: asyncio.Future[int], schedule: StopSchedule) -> None:
        """SIGTERM now, SIGKILL after the grace, and never later than the time
        by which CMD must be dead."""
        self._signal_child(signal.SIGTERM)
        now = time.monotonic()
        kill_at = min(now + schedule.grace_s, schedule.kill_at())
        try:
            await asyncio.wait_for(asyncio.shield(exited), max(0.0, kill_at - now))
        except TimeoutError:
            self.say(f"{self.argv[0]} did not stop within {kill_at - now:.3g}s; killing it",
                     always=True)
            self._signal_child(signal.SIGKILL)
            await exited

    def _signal_child(self, sig: int) -> None:
        child = self.child
        if child is None or child.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if self.foreground:
                child.send_signal(sig)
            else:
                os.killpg(child.pid, sig)

    def _on_signal(self, sig: int) -> None:
        if self.child is None:
            # Not running CMD yet: stop waiting, or do not start it.
            self.stop_signal = sig
            if self.acquiring and self.main_task is not None and not self.main_task.done():
                self.main_task.cancel()
            return
        if self.foreground and sig in TERMINAL_SIGNALS:
            return  # the terminal sent it to CMD as well
        self._signal_child(sig)

