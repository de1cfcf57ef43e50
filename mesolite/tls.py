"""TLS settings shared by every process: which files, and the contexts made from them.

A `TlsConfig` names a CA certificate (which peers must chain to) and, for a process that
proves who it is, a certificate and its key. `TlsConfig.from_dir` reads a bundle that
`mesolite certs init` wrote (`ca.crt`, `tls.crt`, `tls.key`; see mesolite/certs.py). A
principal is a certificate's subject common name (CN).

gRPC channels and servers take the PEM bytes (`TlsConfig.read`, used by
mesolite/grpc_utils.py); aiohttp takes an `ssl.SSLContext` (`server_context`,
`client_context`).

Secure by default: `check_listen` refuses a non-loopback address without TLS unless the
operator said `--insecure`.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from mesolite.errors import MesoliteError

log = structlog.get_logger(__name__)

# The file names of one bundle (a directory per principal; mesolite/certs.py writes them).
CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
TOKEN_FILE = "token"
# A name only the master's certificate holds: gRPC clients check it (not only the CA and
# the address dialled), so an agent's certificate, a server certificate for loopback
# names too, cannot pose as the master.
MASTER_SERVER_NAME = "mesolite-master"


class TlsError(MesoliteError):
    """TLS files that cannot be used, or a listening address refused without TLS."""


@dataclass(frozen=True, slots=True)
class TlsMaterial:
    """The PEM bytes of a `TlsConfig`, read once."""

    ca: bytes
    cert: bytes | None
    key: bytes | None = None

    def __repr__(self) -> str:  # never print a key
        return f"TlsMaterial(ca={len(self.ca)} bytes, cert={self.cert is not None})"


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """The CA to verify peers with, and this process's certificate and key (optional for
    a client that authenticates with a bearer token instead)."""

    ca: Path
    """The cluster CA's certificate (PEM): the master must chain to it."""
    cert: Path | None = None
    """This process's certificate (PEM); its subject CN is its principal."""
    key: Path | None = None
    """The certificate's private key (PEM)."""

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise TlsError("give a certificate and its key together, or neither")
        for name in ("ca", "cert", "key"):  # accept str paths too
            value = getattr(self, name)
            if value is not None and not isinstance(value, Path):
                object.__setattr__(self, name, Path(value))

    @classmethod
    def from_dir(cls, directory: str | Path) -> TlsConfig:
        """The bundle in `directory`: `ca.crt`, with `tls.crt` and `tls.key` if present."""
        directory = Path(directory)
        if not (directory / CA_FILE).is_file():
            raise TlsError(
                f"{directory} has no {CA_FILE}: give a directory `mesolite certs init` wrote "
                "(for example certs/agent)"
            )
        cert, key = directory / CERT_FILE, directory / KEY_FILE
        if cert.exists() != key.exists():
            raise TlsError(f"{directory} has only one of {CERT_FILE} and {KEY_FILE}")
        if cert.exists():
            return cls(directory / CA_FILE, cert, key)
        return cls(directory / CA_FILE)

    @property
    def has_certificate(self) -> bool:
        """Whether this process proves who it is with a certificate (else a token)."""
        return self.cert is not None

    def read(self) -> TlsMaterial:
        """The files' PEM bytes (what gRPC takes); raises `TlsError` if one is unreadable."""
        try:
            return TlsMaterial(
                self.ca.read_bytes(),
                self.cert.read_bytes() if self.cert else None,
                self.key.read_bytes() if self.key else None,
            )
        except OSError as e:
            raise TlsError(f"cannot read TLS files: {e}") from None

    def server_context(self, *, require_client_cert: bool) -> ssl.SSLContext:
        """For an HTTPS server: this certificate, TLS 1.2 at least. A client certificate is
        verified against the CA whenever one is presented, and required if asked."""
        if self.cert is None or self.key is None:
            raise TlsError("a TLS server needs a certificate and key (tls.crt, tls.key)")
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.ca))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.cert, self.key)
        context.verify_mode = ssl.CERT_REQUIRED if require_client_cert else ssl.CERT_OPTIONAL
        return context

    def client_context(self, *, server_name: str | None = None) -> ssl.SSLContext:
        """For an HTTPS client: verifies the server's certificate and host name against the
        CA, and presents this certificate when there is one. With `server_name`, the
        certificate must hold that name, whatever address is dialled: a client of the
        master passes MASTER_SERVER_NAME."""
        try:
            context = (
                ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(self.ca))
                if server_name is None
                else _NamedServerContext.for_name(server_name, self.ca)
            )
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            if self.cert is not None and self.key is not None:
                context.load_cert_chain(self.cert, self.key)
        except (OSError, ssl.SSLError) as e:
            raise TlsError(f"cannot use the TLS files {self}: {e}") from None
        return context


class _NamedServerContext(ssl.SSLContext):
    """A client context that checks the server's certificate for one fixed name, not the
    host in the URL (urllib and http.client pass that host; this replaces it)."""

    server_name: str

    @classmethod
    def for_name(cls, server_name: str, ca: Path) -> _NamedServerContext:
        context = cls(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
        context.load_verify_locations(cafile=str(ca))
        context.server_name = server_name
        return context

    def wrap_socket(
        self,
        sock: socket.socket,
        server_side: bool = False,
        do_handshake_on_connect: bool = True,
        suppress_ragged_eofs: bool = True,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLSocket:
        return super().wrap_socket(
            sock,
            server_side,
            do_handshake_on_connect,
            suppress_ragged_eofs,
            self.server_name,
            session,
        )

    def wrap_bio(
        self,
        incoming: ssl.MemoryBIO,
        outgoing: ssl.MemoryBIO,
        server_side: bool = False,
        server_hostname: str | bytes | None = None,
        session: ssl.SSLSession | None = None,
    ) -> ssl.SSLObject:
        return super().wrap_bio(incoming, outgoing, server_side, self.server_name, session)


def principal_of_peercert(peercert: dict[str, Any] | None) -> str | None:
    """The principal (subject CN) of a verified peer certificate as `SSLSocket.getpeercert()`
    returns it; None without one, or when the subject has no CN or several."""
    if not peercert:
        return None
    names = [
        value for rdn in peercert.get("subject", ()) for key, value in rdn if key == "commonName"
    ]
    return names[0] if len(names) == 1 and names[0] else None


def peer_principal(transport: Any) -> str | None:
    """The principal of the peer on an asyncio transport (aiohttp's `request.transport`),
    from its verified client certificate; None on plain TCP or without a certificate."""
    if transport is None:
        return None
    ssl_object = transport.get_extra_info("ssl_object")
    if ssl_object is None:
        return None
    return principal_of_peercert(ssl_object.getpeercert())


def is_loopback(host: str) -> bool:
    """Whether every address `host` stands for is a loopback address (wildcards are not)."""
    host = host.strip("[]")
    if host in ("", "0.0.0.0", "::"):
        return False
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_listen(what: str, host: str, *, tls: bool, insecure: bool) -> None:
    """Refuse to serve `what` on a non-loopback `host` without TLS, unless `insecure`
    (then warn loudly): anyone who reaches an unauthenticated master can run commands on
    every agent."""
    if tls or is_loopback(host):
        return
    if not insecure:
        raise TlsError(
            f"refusing to serve {what} on {host}, which is not a loopback address, without "
            "TLS: anyone who can reach it could act for every client. Give --tls-dir (make "
            "certificates with `mesolite certs init DIR`), listen on 127.0.0.1, or pass "
            "--insecure if this network is trusted"
        )
    log.warning(
        "INSECURE: serving without TLS or authentication on a non-loopback address; "
        "anyone who reaches it can act as any framework or agent",
        what=what,
        host=host,
    )
