"""The query of `GET /v1/locks/{key}/fence?token=N` (SPEC §3.8)."""

from __future__ import annotations

from urllib.parse import parse_qsl

from fencepost.core.leases import MAX_FENCING_TOKEN
from fencepost.errors import ValidationError
from fencepost.server.messages import Request

# 2^53 - 1 has 16 digits; longer strings are refused before int() reads them.
_MAX_DIGITS = len(str(MAX_FENCING_TOKEN))


def fence_token(request: Request) -> int:
    """The one `token` parameter as a fencing token; every problem (missing,
    repeated, not a non-negative integer below 2^53, unknown parameters) is
    named in one 422."""
    pairs = parse_qsl(request.query_string, keep_blank_values=True)
    details = [
        {"field": name, "message": "unknown query parameter"}
        for name in dict.fromkeys(name for name, _ in pairs)
        if name != "token"
    ]
    tokens = [value for name, value in pairs if name == "token"]
    token = 0
    if len(tokens) != 1:
        message = "is required" if not tokens else "must be given once"
        details.append({"field": "token", "message": message})
    else:
        raw = tokens[0]
        # isascii: str.isdigit also accepts '²' and other digits that int() refuses.
        if raw.isascii() and raw.isdigit() and len(raw) <= _MAX_DIGITS:
            token = int(raw)
        if not (raw.isascii() and raw.isdigit()) or token > MAX_FENCING_TOKEN or \
                len(raw) > _MAX_DIGITS:
            details.append({
                "field": "token",
                "message": f"must be an integer 0..{MAX_FENCING_TOKEN} (a fencing token)",
            })
    if details:
        raise ValidationError(details)
    return token
