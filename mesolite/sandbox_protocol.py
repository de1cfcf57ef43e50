"""The sandbox-reading protocol both ends share: the agent serves it
(`agent/sandbox_http.py`), the master proxies the web UI's requests to it
(`master/ui_routes.py`).

    GET /sandbox/{framework_id}/{task_id}/{stdout|stderr}?offset=&length=

Without `offset` the last `length` bytes (default 64 KiB, at most 1 MiB).
`X-Sandbox-Offset` says where the returned bytes start, `X-Sandbox-Size` how
big the whole file is.
"""

from __future__ import annotations

from mesolite.errors import MesoliteError

FILES = ("stdout", "stderr")
DEFAULT_LENGTH = 64 * 1024
MAX_LENGTH = 1024 * 1024
OFFSET_HEADER = "X-Sandbox-Offset"
SIZE_HEADER = "X-Sandbox-Size"
# The longest file name, in bytes (Linux, macOS): a longer segment can name no directory
# (opening it fails with ENAMETOOLONG, which the sandbox server answered with a 500).
NAME_MAX = 255


class BadRequest(MesoliteError, ValueError):
    """A request that names no sandbox file (a bad id or query parameter)."""


def check_segment(kind: str, value: str) -> str:
    """`value` if it can name one directory under the sandboxes; raises BadRequest if not."""
    if (
        not value
        or value in (".", "..")
        or any(c in value for c in "/\\\0")
        or len(value.encode(errors="surrogatepass")) > NAME_MAX
    ):
        raise BadRequest(f"invalid {kind}: {value!r}")
    return value


def parse_range(offset: str | None, length: str | None) -> tuple[int | None, int]:
    """The `offset` (None: read the tail) and `length` query parameters, checked."""
    try:
        start = None if offset in (None, "") else int(offset)
        size = DEFAULT_LENGTH if length in (None, "") else int(length)
    except ValueError:
        raise BadRequest("offset and length must be integers") from None
    if (start is not None and start < 0) or size < 0:
        raise BadRequest("offset and length must not be negative")
    return start, min(size, MAX_LENGTH)
