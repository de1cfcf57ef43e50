"""Which Host headers an HTTP server of mesolite answers: a defence against DNS rebinding.

A web page from anywhere can make a browser send requests to 127.0.0.1 or to a
machine inside a private network, by pointing a name of its own at that address
(DNS rebinding); the browser then treats the answers as the page's own. Those
requests carry the attacker's name in their Host header. The master's HTTP server
and each agent's sandbox server answer only requests whose Host is one of:

- a name or address given with `--http-allowed-hosts` (`*` turns the check off,
  say behind a reverse proxy that checks it);
- the address the server listens on (unless a wildcard such as 0.0.0.0);
- `localhost`, `127.0.0.1`, `::1`, and this machine's host name;
- the address the request's connection arrived at (so a server on 0.0.0.0
  answers to each of its own addresses).

Anything else gets 421 Misdirected Request; a request without a Host header, 400.
The port is not compared (a proxy or a port forward may change it).

    app = web.Application(middlewares=[host_check(AllowedHosts(["ui.example"], "0.0.0.0"))])
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

WILDCARDS = frozenset({"", "0.0.0.0", "::"})
ANY = "*"


def normal_host(value: str) -> str | None:
    """The host of a Host header or a configured name, compared as: lower case, no port,
    no brackets, no trailing dot. None if it is no host (empty, or with a space, say)."""
    host = value.strip().lower()
    if host.startswith("["):
        inner, bracket, rest = host[1:].partition("]")
        if not bracket or (rest and not (rest[0] == ":" and rest[1:].isdigit())):
            return None
        try:
            return str(ipaddress.IPv6Address(inner))
        except ValueError:
            return None
    if host.count(":") == 1:
        host, _, port = host.partition(":")
        if not port.isdigit():
            return None
    elif ":" in host:  # an IPv6 address without brackets: a configured name only
        try:
            return str(ipaddress.IPv6Address(host))
        except ValueError:
            return None
    host = host.rstrip(".")
    if not host or any(c.isspace() or c in "/\\@?#" for c in host):
        return None
    return host


class AllowedHosts:
    """The Host headers one server answers (see the module docstring)."""

    def __init__(self, names: Iterable[str] = (), listen_host: str = "") -> None:
        given = list(names)
        self.any = ANY in given
        defaults = ["localhost", "127.0.0.1", "::1", socket.gethostname()]
        if listen_host not in WILDCARDS:
            defaults.append(listen_host)
        self.names = frozenset(
            host for name in (*defaults, *given) if name != ANY and (host := normal_host(name))
        )

    def allows(self, host_header: str, local_address: str | None = None) -> bool:
        """Whether to answer a request with this Host header, arriving at `local_address`."""
        if self.any:
            return True
        host = normal_host(host_header)
        if host is None:
            return False
        if host in self.names:
            return True
        return local_address is not None and host == normal_host(local_address)


def host_check(allowed: AllowedHosts) -> Middleware:
    """An aiohttp middleware that refuses requests for hosts `allowed` does not list."""

    @web.middleware
    async def check_host(request: web.Request, handler: Handler) -> web.StreamResponse:
        header = request.headers.get("Host")
        if header is None:
            raise web.HTTPBadRequest(text="a Host header is required")
        sockname = request.transport.get_extra_info("sockname") if request.transport else None
        local = str(sockname[0]) if isinstance(sockname, tuple) and sockname else None
        if not allowed.allows(header, local):
            raise web.HTTPMisdirectedRequest(
                text="this server does not answer for that host name (see --http-allowed-hosts)"
            )
        return await handler(request)

    return check_host


__all__ = ["AllowedHosts", "host_check", "normal_host"]
