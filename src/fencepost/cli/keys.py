"""`fencepost key ...` and `fencepost whoami`."""

from __future__ import annotations

import click

from fencepost.cli.common import Ctx, api_command, connection_options
from fencepost.cli.quiet import check_output_mode, quiet_option
from fencepost.cli.render import relative, table


@click.group()
def key() -> None:
    """Create, list and revoke API keys of your project (admin), or refresh your own."""


@key.command("create")
@click.option("--role", type=click.Choice(["admin", "member", "reader"]), required=True,
              help="reader: GET only; member: also acquire/renew/release; admin: everything.")
@click.option("--name", default=None, help="A label (1..128 characters).")
@click.option("--expires-in", type=click.IntRange(1, 315_360_000), default=None,
              metavar="SECONDS", help="The key stops working after this.")
@click.option("--allow-ip", "allow_ips", multiple=True, metavar="CIDR",
              help="Accept requests only from here (repeatable).")
@click.option("--rpm-quota", type=click.IntRange(1, 1_000_000), default=None,
              help="Requests per minute.")
@quiet_option("the secret, and no remark on stderr")
@connection_options
@api_command
async def create(ctx: Ctx, role: str, name: str | None, expires_in: int | None,
                 allow_ips: tuple[str, ...], rpm_quota: int | None, quiet: bool) -> None:
    """Create an API key and print its secret alone on stdout (it is shown only
    once), so that `KEY=$(fencepost key create --role member)` works."""
    check_output_mode(ctx, quiet)
    async with ctx.client() as client:
        created = await client.create_key(
            role, name=name, expires_in=expires_in,  # type: ignore[arg-type]
            allow_ips=list(allow_ips) if allow_ips else None, rpm_quota=rpm_quota,
        )
    if ctx.as_json:
        ctx.emit(created.to_dict(), "")
        return
    if not quiet:
        ctx.note(f"created {created.role} key {created.id}"
                 + (f" ({created.name})" if created.name else "")
                 + f" in project {created.project}; its secret (shown once):")
    click.echo(created.key)


@key.command("refresh")
@click.option("--expires-in", type=click.IntRange(1, 315_360_000), default=None,
              metavar="SECONDS",
              help="The new key's lifetime (default: the current key's own; never longer "
                   "than an admin granted the original).")
@click.option("--retire-previous", is_flag=True, default=False,
              help="Retire the key in use once its successor is minted (in the same store "
                   "operation): deploy the new secret first.")
@quiet_option("the secret, and no remark on stderr")
@connection_options
@api_command
async def refresh(ctx: Ctx, expires_in: int | None, retire_previous: bool, quiet: bool) -> None:
    """Mint a successor of the API key in use (any role) and print its secret
    alone on stdout (shown only once), so that
    `FENCEPOST_API_KEY=$(fencepost key refresh -q)` swaps keys. The current key
    keeps working until its own expiry (unless --retire-previous); revoking it
    revokes the successor too."""
    check_output_mode(ctx, quiet)
    async with ctx.client() as client:
        created = await client.refresh_key(expires_in, retire_previous)
    if ctx.as_json:
        ctx.emit(created.to_dict(), "")
        return
    if not quiet:
        expiry = f", expires {relative(created.expires_at)}" if created.expires_at else ""
        ctx.note(f"refreshed: new {created.role} key {created.id}{expiry}; "
                 "its secret (shown once):")
    click.echo(created.key)


@key.command("list")
@connection_options
@api_command
async def list_(ctx: Ctx) -> None:
    """List the project's keys (never their secrets): each key's state (active,
    expired, retired, revoked) and the key it was refreshed FROM, its lineage."""
    async with ctx.client() as client:
        keys = await client.list_keys()
    ctx.emit({"keys": [k.to_dict() for k in keys]}, lambda: table(
        ["ID", "ROLE", "NAME", "STATE", "FROM", "CREATED", "EXPIRES", "RPM", "ALLOW IPS"],
        [[k.id, k.role, k.name, k.state, k.refreshed_from, relative(k.created_at),
          relative(k.expires_at) if k.expires_at else None, k.rpm_quota,
          ",".join(k.allow_ips)] for k in keys],
    ))


@key.command("revoke")
@click.argument("key_id")
@connection_options
@api_command
async def revoke(ctx: Ctx, key_id: str) -> None:
    """Revoke key KEY_ID (refused everywhere within 2 s). Exit code 5 if unknown."""
    async with ctx.client() as client:
        revoked = await client.revoke_key(key_id)
    ctx.emit({"revoked": revoked}, f"revoked key {key_id}")


@key.command("retire")
@click.argument("key_id")
@connection_options
@api_command
async def retire(ctx: Ctx, key_id: str) -> None:
    """Retire key KEY_ID (an admin, or the key itself): it stops working, the keys
    refreshed from it do not (a planned rotation; `revoke` a leaked key, which
    takes its successors too). Exit code 5 if unknown."""
    async with ctx.client() as client:
        retired = await client.retire_key(key_id)
    ctx.emit({"retired": retired},
             f"retired key {key_id}" if retired else f"key {key_id} was revoked already")


@click.command()
@connection_options
@api_command
async def whoami(ctx: Ctx) -> None:
    """Show the project, key ID, role and expiry of your API key (or token)."""
    async with ctx.client() as client:
        me = await client.whoami()
    expiry = f", expires {relative(me.expires_at)}" if me.expires_at else ""
    who = f"key {me.key_id}"
    if me.via == "jwt":
        who = f"{me.key_id}" + (f" ({me.key_name})" if me.key_name else "")
        if me.app_key_id:
            who += f" through key {me.app_key_id}"
    ctx.emit(me.to_dict(), f"{who} ({me.role}) in project {me.project}{expiry}")
