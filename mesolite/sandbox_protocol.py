"""The sandbox-reading protocol both ends share: the agent serves it
(`agent/sandbox_http.py`), the master proxies the web UI's requests to it
(`master/ui_routes.py`).

    GET /sandbox/{framework_id}/{task_id}/{stdout|stderr}?offset=&length=

Without `offset` the last `length` bytes (default 64 KiB, at most 1 MiB).
`X-Sandbox-Offset` says where the returned bytes start, `X-Sandbox-Size` how
big the whole file is.

An agent registers where it serves this as HOST:PORT (`parse_address`: a DNS name,
an IPv4 address or a bracketed IPv6 address, and a port; nothing else). The master
builds every URL it fetches from a parsed host and port and checked path segments
(`sandbox_url`), never by pasting the registered text into a URL.
"""

from __future__ import annotations

import ipaddress
import re

from yarl import URL

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


_PORT = re.compile(r"[0-9]{1,5}")
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_ADDRESS = 300


def parse_address(address: str) -> tuple[str, int] | None:
    """(host, port) of `address` if it is exactly HOST:PORT; None if it is anything else.

    HOST is a DNS name (letters, digits and hyphens in dot-separated labels, the last
    not all digits), a dotted-quad IPv4 address or an IPv6 address in brackets (no
    zone); PORT is 1 to 65535. No scheme, user, path, query or fragment can pass.
    """
    if len(address) > MAX_ADDRESS:
        return None
    host, sep, port_text = address.rpartition(":")
    if not sep or not _PORT.fullmatch(port_text) or not 0 < int(port_text) < 65536:
        return None
    port = int(port_text)
    if host.startswith("[") and host.endswith("]"):
        inner = host[1:-1]
        if "%" in inner:
            return None
        try:
            return str(ipaddress.IPv6Address(inner)), port
        except ValueError:
            return None
    try:
        return str(ipaddress.IPv4Address(host)), port
    except ValueError:
        pass
    labels = host.split(".")
    if (
        len(host) > 253
        or not all(_LABEL.fullmatch(label) for label in labels)
        or labels[-1].isdigit()  # "127.1": no name, and resolvers read it as an address
    ):
        return None
    return host, port


def format_address(host: str, port: int) -> str:
    """HOST:PORT, with an IPv6 address in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def sandbox_url(
    host: str, port: int, framework_id: str, task_id: str, name: str, query: dict[str, str]
) -> URL:
    """The URL of one sandbox file on an agent's sandbox server, built from its parts.

    Raises BadRequest if an id is not a plain path segment or `name` is not a file served.
    """
    if name not in FILES:
        raise BadRequest(f"no sandbox file {name!r}")
    segments = (check_segment("framework id", framework_id), check_segment("task id", task_id))
    return URL.build(
        scheme="http",
        host=host,
        port=port,
        path=f"/sandbox/{segments[0]}/{segments[1]}/{name}",
        query=query,
    )


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
