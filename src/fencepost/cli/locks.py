"""`fencepost lock ...`: acquire, renew, release, show, list, force-release, fence
(and its old name fence-check)."""

from __future__ import annotations

import copy
from typing import Any

import click

from fencepost.cli.common import Ctx, api_command, connection_options, follow_pages
from fencepost.cli.exitcodes import ExitCode
from fencepost.cli.params import JSON_OBJECT, NAME, UUID, Seconds
from fencepost.cli.progress import ProgressLine, lock_waiting, while_waiting
from fencepost.cli.quiet import check_output_mode, emit_created, quiet_option
from fencepost.cli.render import (
    compact_json,
    duration,
    fields,
    key_label,
    relative,
    table,
    when,
)
from fencepost.client.calls import new_token
from fencepost.client.models import LockInfo

TTL = click.IntRange(5, 7_776_000)


@click.group()
def lock() -> None:
    """Acquire, renew, release and inspect locks.

    A lock is held by a lock token (a UUID) that you keep for the lease's life;
    `acquire` prints it (or use --token to choose it). To hold a lock while a
    command runs, with renewal and release done for you, use `fencepost run`.
    """


@lock.command("acquire")
@click.argument("key", type=NAME)
@click.option("--ttl", type=TTL, default=60, show_default=True, metavar="SECONDS",
              help="Lease length (5..7776000).")
@click.option("--wait", type=Seconds(min=0), default=0, show_default=True,
              metavar="SECONDS", help="How long to wait in line; 0 fails fast.")
@click.option("--operation", default=None, help="What you are doing (shown to others).")
@click.option("--metadata", type=JSON_OBJECT, default=None, help="JSON object of holder details.")
@click.option("--on-expiry", type=click.Choice(["release", "keep"]), default="release",
              show_default=True, help="keep: stay held (overdue) past the TTL.")
@click.option("--lock-delay", type=click.IntRange(0, 60), default=0, show_default=True,
              metavar="SECONDS",
              help="If the lease ends by expiry or force release, nobody gets the lock "
                   "for this long (0..60).")
@click.option("--token", type=UUID, default=None,
              help="Lock token to use (default: a new one). Reusing it makes retries safe.")
@click.option("--shared", is_flag=True, default=False,
              help="A shared (reader) lease: others with --shared may hold the lock too.")
@quiet_option("the lock token")
@connection_options
@api_command
async def acquire(ctx: Ctx, key: str, ttl: int, wait: float, operation: str | None,
                  metadata: dict[str, Any] | None, on_expiry: str, lock_delay: int,
                  token: str | None, shared: bool, quiet: bool) -> None:
    """Acquire lock KEY and print its lock token and fencing token.

    The lease is not renewed after this command exits: renew it with
    `fencepost lock renew` before it expires, and release it when done.
    Exit code 3 when the lock is held (after waiting, if --wait).
    With -q, only the lock token: TOKEN=$(fencepost lock acquire KEY -q).
    """
    check_output_mode(ctx, quiet)
    token = token or new_token()
    async with ctx.client() as client:
        work = client.acquire_lock(key, ttl=ttl, wait=wait, operation=operation,
                                   metadata=metadata, on_expiry=on_expiry,  # type: ignore[arg-type]
                                   lock_delay=lock_delay, shared=shared, token=token)
        lease = await while_waiting(work, lock_waiting(client, key), ProgressLine())
    emit_created(ctx, quiet, lease.lock_token, lease.to_dict(), lambda: "\n".join([
        f"acquired lock {lease.key}: fencing token {lease.fencing_token}, "
        f"expires {relative(lease.expires_at)}"
        + ("" if lease.created else " (this token already held it)"),
        f"lock token: {lease.lock_token}",
        f"  renew:   fencepost lock renew {lease.key} --token {lease.lock_token} --ttl {ttl}",
        f"  release: fencepost lock release {lease.key} --token {lease.lock_token}",
    ]))


@lock.command("renew")
@click.argument("key", type=NAME)
@click.option("--token", type=UUID, required=True, help="The lock token from acquire.")
@click.option("--ttl", type=TTL, default=60, show_default=True, metavar="SECONDS",
              help="New lease length from now.")
@connection_options
@api_command
async def renew(ctx: Ctx, key: str, token: str, ttl: int) -> None:
    """Renew the lease TOKEN holds on lock KEY. Exit code 4 when it is lost or expired."""
    async with ctx.client() as client:
        renewal = await client.renew_lock(key, token, ttl=ttl)
    ctx.emit(renewal.to_dict(), lambda: (
        f"renewed lock {renewal.key}: fencing token {renewal.fencing_token}, "
        f"expires {relative(renewal.expires_at)}"
    ))


@lock.command("release")
@click.argument("key", type=NAME)
@click.option("--token", type=UUID, required=True, help="The lock token from acquire.")
@connection_options
@api_command
async def release(ctx: Ctx, key: str, token: str) -> None:
    """Release the lease TOKEN holds on lock KEY (idempotent: exit 0 either way)."""
    async with ctx.client() as client:
        released = await client.release_lock(key, token)
    ctx.emit({"released": released}, f"released lock {key}" if released
             else f"lock {key} was not held by this token; nothing to release")


def _line(info: LockInfo) -> str:
    """The waiters in order, each with how long it has waited and will wait."""
    if not info.waiters:
        return ""
    rows = [[str(place), key_label(w.key_id, w.key_name),
             relative(w.since_at), relative(w.gives_up_at)]
            for place, w in enumerate(info.line, start=1)]
    more = info.waiters - len(info.line)
    return "\nline:\n" + table(["#", "KEY", "SINCE", "GIVES UP"], rows) + (
        f"\n... and {more} more" if more > 0 else "")


def _describe(info: LockInfo) -> str:
    if not info.held:
        waiting = f" ({info.waiters} waiting)" if info.waiters else ""
        return f"{info.key}: free{waiting}" + _line(info)
    holder = info.holder
    head = f"{info.key}: held, fencing token {info.fencing_token}\n"
    if info.mode == "shared":
        head = (f"{info.key}: held shared by {info.holders}; the oldest has fencing token "
                f"{info.fencing_token}\n")
    return head + fields([
        ("holder", key_label(holder.key_id, holder.key_name) if holder else None),
        ("operation", info.operation),
        ("acquired", when(info.acquired_at)),
        ("expires", when(info.expires_at) + (" OVERDUE" if info.overdue else "")),
        ("deadline", when(info.deadline_at)),
        ("on expiry", info.on_expiry),
        ("waiters", info.waiters),
        ("metadata", compact_json(info.metadata) if info.metadata else None),
    ]) + _line(info)


@lock.command("show")
@click.argument("key", type=NAME)
@connection_options
@api_command
async def show(ctx: Ctx, key: str) -> None:
    """Show lock KEY: who holds it (API key), operation, fencing token, expiry,
    and who waits in line (in order)."""
    async with ctx.client() as client:
        info = await client.get_lock(key)
    ctx.emit(info.to_dict(), lambda: _describe(info))


@lock.command("list")
@click.option("--prefix", default=None, help="Only keys starting with this.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="At most this many locks (pages are followed).")
@connection_options
@api_command
async def list_(ctx: Ctx, prefix: str | None, limit: int) -> None:
    """List held locks, sorted by key."""
    async with ctx.client() as client:

        async def fetch(after: str | None, size: int) -> tuple[list[LockInfo], str | None]:
            page = await client.list_locks(prefix=prefix, limit=size, after=after)
            return page.locks, page.next

        locks, after = await follow_pages(fetch, limit)
    ctx.emit({"locks": [i.to_dict() for i in locks], "next": after}, lambda: table(
        ["KEY", "HOLDER", "TOKEN", "OPERATION", "HELD FOR", "EXPIRES", "WAITERS"],
        [[i.key, (i.holder.key_name or i.holder.key_id) if i.holder else None,
          i.fencing_token, i.operation,
          relative(i.acquired_at).removesuffix(" ago") if i.acquired_at else None,
          "overdue" if i.overdue else relative(i.expires_at), i.waiters] for i in locks],
    ) if locks else "no locks held")


@lock.command("force-release")
@click.argument("key", type=NAME)
@connection_options
@api_command
async def force_release(ctx: Ctx, key: str) -> None:
    """Release lock KEY without its lock token: an admin may end any lease, a
    member one its own API key took. Its holder's next renewal fails."""
    async with ctx.client() as client:
        result = await client.force_release(key)

    def human() -> str:
        if not result.released:
            return f"lock {key} was not held; nothing to release"
        age = duration((result.age_ms or 0) / 1000)
        leases = f"{result.released_count} leases, the oldest with " if (
            result.released_count > 1) else ""
        return (f"force-released lock {key} ({leases}fencing token {result.fencing_token}, "
                f"operation {result.operation or '-'}, held for {age})")

    ctx.emit(result.to_dict(), human)


@lock.command("fence")
@click.argument("key", type=NAME)
@click.argument("token", type=click.IntRange(0, 2**53 - 1))
@connection_options
@api_command
async def fence_check(ctx: Ctx, key: str, token: int) -> int:
    """Check whether fencing token TOKEN is the one of lock KEY's live lease.

    Exit code 0 when it is current, 4 when it is stale (the output says why:
    expired, released, force_released, superseded or unknown).
    """
    async with ctx.client() as client:
        result = await client.fence_check(key, token)

    def human() -> str:
        if result.current:
            return f"fencing token {token} is current for lock {key}"
        live = f"; the live token is {result.live_token}" if result.live_token else ""
        return f"fencing token {token} is stale for lock {key} ({result.reason}){live}"

    ctx.emit(result.to_dict(), human)
    return int(ExitCode.OK if result.current else ExitCode.LOST)


# The command's first name, kept so that scripts written for it still work;
# hidden from the help, which names `fence`.
_fence_check = copy.copy(fence_check)
_fence_check.hidden = True
lock.add_command(_fence_check, "fence-check")
