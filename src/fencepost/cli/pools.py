"""`fencepost pool ...`: set, show, list, delete, acquire, renew, release."""

from __future__ import annotations

from typing import Any

import click

from fencepost.cli.common import Ctx, api_command, connection_options, follow_pages
from fencepost.cli.params import HEADER, NAME, Seconds, SecretHeader
from fencepost.cli.progress import ProgressLine, slot_waiting, while_waiting
from fencepost.cli.quiet import check_output_mode, emit_created, quiet_option
from fencepost.cli.render import duration, epoch_ms, fields, key_label, relative, table, when
from fencepost.client import Outcome, Upstream
from fencepost.client.models import Learned, PoolInfo, SlotHolder
from fencepost.client.outcome import rate_headers
from fencepost.errors import NotFound

MS = click.IntRange(min=0)


@click.group()
def pool() -> None:
    """Configure pools (counting semaphores) and take slots in them.

    To hold a slot while a command runs, with renewal and release done for you,
    use `fencepost run --pool`.
    """


@pool.command("set")
@click.argument("name", type=NAME)
@click.option("--limit", type=click.IntRange(1, 10_000), default=None,
              help="Most slots held at once (needed to create the pool).")
@click.option("--queue-size", type=click.IntRange(0, 100_000), default=None,
              help="Most waiters; 0 disables waiting [server default 100].")
@click.option("--queue-timeout-ms", type=MS, default=None,
              help="Longest any acquire may wait [30000].")
@click.option("--term-ms", type=MS, default=None, help="Slot lease term [30000].")
@click.option("--renew-interval-ms", type=MS, default=None,
              help="Suggested renewal interval [term/3].")
@click.option("--request-timeout-ms", type=MS, default=None,
              help="Absolute cap on a slot's life [60000].")
@click.option("--rpm", type=click.IntRange(min=1), default=None,
              help="Admissions per minute.")
@click.option("--adaptive/--no-adaptive", default=None, help="Learn the limit from outcomes.")
@click.option("--min-limit", type=click.IntRange(min=1), default=None,
              help="Floor for the learned limit.")
@click.option("--upstream-url", default=None, metavar="URL",
              help="Proxy mode: the http(s) base URL the pool calls; "
                   "/v1/pools/NAME/proxy/PATH goes to URL/PATH.")
@click.option("--upstream-header", "upstream_headers", type=SecretHeader(), multiple=True,
              help="Proxy mode: a header the pool adds to every call (a credential), as "
                   "NAME=env:VARIABLE or NAME=file:PATH; repeat for more. Replaces the "
                   "pool's whole set. The server never shows the values again.")
@click.option("--upstream-timeout-ms", type=click.IntRange(100, 600_000), default=None,
              help="Proxy mode: the upstream's answer must begin within this [60000].")
@click.option("--max-body-bytes", type=click.IntRange(0, 2**30), default=None,
              help="Proxy mode: the largest body either way [10485760].")
@click.option("--no-upstream", is_flag=True, default=False,
              help="Turn proxy mode off: forget the upstream and its headers.")
@click.option("--cost-per-minute", type=click.IntRange(1, 10**12), default=None,
              metavar="UNITS",
              help="A unit budget: the tokens (or other units) the upstream allows per "
                   "minute; calls are admitted as their costs fit it.")
@click.option("--no-cost-budget", is_flag=True, default=False,
              help="Forget the configured unit budget.")
@quiet_option("the pool's name")
@connection_options
@api_command
async def set_(ctx: Ctx, name: str, limit: int | None, queue_size: int | None,
               queue_timeout_ms: int | None, term_ms: int | None,
               renew_interval_ms: int | None, request_timeout_ms: int | None,
               rpm: int | None, adaptive: bool | None, min_limit: int | None,
               upstream_url: str | None, upstream_headers: tuple[tuple[str, str], ...],
               upstream_timeout_ms: int | None, max_body_bytes: int | None,
               no_upstream: bool, cost_per_minute: int | None, no_cost_budget: bool,
               quiet: bool) -> None:
    """Change pool NAME's configuration (admin): only the options given change.
    Creates the pool when there is none (then --limit is needed and options
    left out take the server's defaults)."""
    check_output_mode(ctx, quiet)
    upstream = None
    if upstream_url is not None or upstream_headers or upstream_timeout_ms is not None:
        if no_upstream:
            raise click.UsageError("--no-upstream goes with no other --upstream option.")
        upstream = Upstream(base_url=upstream_url,
                            headers=dict(upstream_headers) if upstream_headers else None,
                            timeout_ms=upstream_timeout_ms)
    fields: dict[str, Any] = {
        "limit": limit, "queue_size": queue_size, "queue_timeout_ms": queue_timeout_ms,
        "term_ms": term_ms, "renew_interval_ms": renew_interval_ms,
        "request_timeout_ms": request_timeout_ms, "rpm": rpm, "adaptive": adaptive,
        "min_limit": min_limit, "upstream": upstream, "max_body_bytes": max_body_bytes,
        "cost_per_minute": cost_per_minute,
    }
    if cost_per_minute is not None and no_cost_budget:
        raise click.UsageError("--no-cost-budget goes without --cost-per-minute.")
    unset: list[Any] = (["upstream"] if no_upstream else []) + (
        ["cost_per_minute"] if no_cost_budget else [])
    if all(value is None for value in fields.values()) and not unset:
        raise click.UsageError("Nothing to set: give --limit or another option.")
    async with ctx.client() as client:
        try:
            info = await client.update_pool(name, **fields, unset=unset)
        except NotFound:
            if limit is None:
                raise NotFound(f"No pool named {name!r}; give --limit to create it.") from None
            info = await client.set_pool(name, **{**fields, "limit": limit})
    emit_created(ctx, quiet, info.name, info.to_dict(), lambda: "configured " + _describe(info))


def _ms(value: int | None) -> str | None:
    return None if value is None else duration(value / 1000)


def _describe(info: PoolInfo) -> str:
    return f"pool {info.name}: {info.in_use}/{info.effective_limit} in use, " \
           f"{info.queued} queued\n" + fields([
               ("limit", info.limit),
               ("effective limit", info.effective_limit),
               ("queue size", info.queue_size),
               ("queue timeout", _ms(info.queue_timeout_ms)),
               ("term", _ms(info.term_ms)),
               ("renew interval", _ms(info.renew_interval_ms)),
               ("request timeout", _ms(info.request_timeout_ms)),
               ("rpm", info.rpm),
               ("adaptive", "yes" if info.adaptive else "no"),
               ("min limit", info.min_limit),
               ("upstream", None if info.upstream is None else info.upstream.base_url),
               ("upstream headers", None if info.upstream is None
                else ", ".join(info.upstream.headers) or "none"),
               ("max body", info.max_body_bytes),
               ("cost per minute", info.cost_per_minute),
           ]) + _describe_learned(info.learned)


def _describe_learned(learned: Learned | None) -> str:
    """What the pool learned (SPEC §4.5); nothing when it learned nothing."""
    if learned is None:
        return ""
    hint = learned.last_hint
    rows: list[tuple[str, object]] = [
        ("effective limit", learned.effective_limit),
        ("effective rpm", learned.effective_rpm),
        ("window", _ms(learned.window_ms)),
        ("paused until", None if learned.paused_until_at is None
         else when(learned.paused_until_at)),
        ("last hint", None if hint is None else
         f"{_ms(hint.retry_after_ms)} from {hint.source}, {relative(hint.at)}"),
        ("slow start", "yes (doubling while calls succeed)" if learned.slow_start else None),
        ("cost per minute", learned.effective_cost_per_minute),
        ("stated by upstream", learned.cost_per_minute),
        ("cost remaining", learned.remaining_cost),
        ("average cost", None if learned.average_cost is None
         else round(learned.average_cost)),
    ]
    return "\nlearned:\n" + fields(rows)


def _slots(slots: list[SlotHolder]) -> str:
    if not slots:
        return "no live slots"
    return table(
        ["SLOT", "KEY", "HELD FOR", "LAPSES", "REQUEST DEADLINE"],
        [[s.slot_id_prefix + "...", key_label(s.key_id, s.key_name),
          relative(s.acquired_at).removesuffix(" ago"),
          relative(epoch_ms(s.lease_deadline)), relative(epoch_ms(s.request_deadline))]
         for s in slots],
    )


@pool.command("show")
@click.argument("name", type=NAME)
@connection_options
@api_command
async def show(ctx: Ctx, name: str) -> None:
    """Show pool NAME: configuration, slots in use, waiters, and who holds each
    live slot (the API key; only a prefix of each slot id)."""
    async with ctx.client() as client:
        info = await client.get_pool(name)
        slots = await client.list_slots(name)
    ctx.emit({**info.to_dict(), "slots": [s.to_dict() for s in slots]},
             lambda: _describe(info) + "\n" + _slots(slots))


@pool.command("list")
@click.option("--prefix", default=None, help="Only names starting with this.")
@click.option("--limit", type=click.IntRange(1, 100_000), default=100, show_default=True,
              help="At most this many pools (pages are followed).")
@connection_options
@api_command
async def list_(ctx: Ctx, prefix: str | None, limit: int) -> None:
    """List pools, sorted by name."""
    async with ctx.client() as client:

        async def fetch(after: str | None, size: int) -> tuple[list[PoolInfo], str | None]:
            page = await client.list_pools(prefix=prefix, limit=size, after=after)
            return page.pools, page.next

        pools, after = await follow_pages(fetch, limit)
    ctx.emit({"pools": [p.to_dict() for p in pools], "next": after}, lambda: table(
        ["NAME", "LIMIT", "EFFECTIVE", "IN USE", "QUEUED", "TERM"],
        [[p.name, p.limit, p.effective_limit, p.in_use, p.queued, _ms(p.term_ms)]
         for p in pools],
    ) if pools else "no pools")


@pool.command("delete")
@click.argument("name", type=NAME)
@connection_options
@api_command
async def delete(ctx: Ctx, name: str) -> None:
    """Delete pool NAME (admin): its slots end, its waiters are refused."""
    async with ctx.client() as client:
        deleted = await client.delete_pool(name)
    ctx.emit({"deleted": deleted}, f"deleted pool {name}")


@pool.command("acquire")
@click.argument("name", type=NAME)
@click.option("--wait", type=Seconds(min=0), default=0, show_default=True,
              metavar="SECONDS", help="How long to wait for a slot; 0 fails fast.")
@click.option("--no-queue", is_flag=True, help="Fail fast even if --wait is given.")
@click.option("--cost", type=click.IntRange(0, 10**9), default=None, metavar="UNITS",
              help="The units (tokens) the call will spend of the pool's budget "
                   "[default: the pool's average].")
@quiet_option("the slot ID")
@connection_options
@api_command
async def acquire(ctx: Ctx, name: str, wait: float, no_queue: bool, cost: int | None,
                  quiet: bool) -> None:
    """Take a slot of pool NAME and print its slot ID. It is not renewed after
    this command exits. Exit code 3 when no slot is free (in time).
    With -q, only the slot ID: SLOT=$(fencepost pool acquire NAME -q)."""
    check_output_mode(ctx, quiet)
    async with ctx.client() as client:
        work = client.acquire_slot(name, wait=wait, no_queue=no_queue, cost=cost)
        grant = await while_waiting(work, slot_waiting(client, name), ProgressLine())
    emit_created(ctx, quiet, grant.slot_id, grant.to_dict(), lambda: "\n".join([
        f"took a slot of pool {name}: lapses {relative(epoch_ms(grant.lease_deadline))} "
        f"unless renewed (every {duration(grant.renew_interval_ms / 1000)})"
        + (f"; {grant.remaining_slots} left" if grant.remaining_slots is not None else "")
        + (f"; {grant.remaining_cost} units of the budget left this minute"
           if grant.remaining_cost is not None else ""),
        f"slot id: {grant.slot_id}",
        f"  renew:   fencepost pool renew {name} {grant.slot_id}",
        f"  release: fencepost pool release {name} {grant.slot_id} [--status CODE]",
    ]))


@pool.command("renew")
@click.argument("name", type=NAME)
@click.argument("slot_id")
@connection_options
@api_command
async def renew(ctx: Ctx, name: str, slot_id: str) -> None:
    """Extend slot SLOT_ID of pool NAME by one term. Exit code 5 when the slot is
    gone, 4 when it is at its request deadline."""
    async with ctx.client() as client:
        renewal = await client.renew_slot(name, slot_id)
    ctx.emit(renewal.to_dict(),
             lambda: f"renewed slot: lapses {relative(epoch_ms(renewal.lease_deadline))}")


@pool.command("release")
@click.argument("name", type=NAME)
@click.argument("slot_id")
@click.option("--status", type=click.IntRange(100, 599), default=None,
              help="The upstream's final HTTP status.")
@click.option("--throttled", type=click.IntRange(min=0), default=None,
              help="How many upstream 429s were seen.")
@click.option("--retry-after-ms", type=click.IntRange(min=0), default=None,
              help="The upstream's retry hint.")
@click.option("--header", "headers", type=HEADER, multiple=True,
              help="An upstream rate-limit header, 'Name: value' (repeatable).")
@click.option("--cost", type=click.IntRange(0, 10**9), default=None, metavar="UNITS",
              help="The units the call really spent (replaces the estimate).")
@connection_options
@api_command
async def release(ctx: Ctx, name: str, slot_id: str, status: int | None,
                  throttled: int | None, retry_after_ms: int | None,
                  headers: tuple[tuple[str, str], ...], cost: int | None) -> None:
    """Release slot SLOT_ID of pool NAME, reporting the upstream outcome
    (idempotent: exit 0 either way)."""
    outcome = Outcome(status=status, throttled=throttled, retry_after_ms=retry_after_ms,
                      headers=rate_headers(dict(headers)), cost=cost)
    async with ctx.client() as client:
        released = await client.release_slot(name, slot_id, outcome)
    ctx.emit({"released": released}, "released the slot" if released
             else "the slot was already gone; nothing to release")
