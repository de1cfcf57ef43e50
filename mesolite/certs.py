"""Certificates for a cluster: a CA and one certificate per principal, made in one call.

`mesolite certs init DIR` calls `init_cluster`, which writes:

    DIR/ca.crt  DIR/ca.key           the cluster's CA (keep ca.key off the cluster's machines)
    DIR/master/ca.crt tls.crt tls.key    the master's bundle: its server and client certificate
    DIR/agent/...                    one bundle per principal: `--tls-dir DIR/<name>`
    DIR/workloads/...                the master's built-in job and service frameworks
    DIR/<principal>/token            with `--token NAME`: a bearer token (no certificate)
    DIR/credentials                  with `--token NAME`: the master's hashed tokens

**A principal is a certificate's subject common name (CN)**: the master knows a client
by the CN of the certificate it presented, the agent's sandbox server knows the master by
its own. Master and agent certificates are server certificates too, valid for
`localhost`, `127.0.0.1`, `::1` and the host names given; other principals' are client
certificates only, so a framework's certificate cannot pose as the master. `issue` adds a
principal to an existing DIR later (`mesolite certs issue DIR NAME`).

Keys are ECDSA P-256, written 0600; bundles are directories 0700. Standard library and
`cryptography` only.
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from mesolite import credentials
from mesolite.errors import MesoliteError
from mesolite.tls import CA_FILE, CERT_FILE, KEY_FILE, MASTER_SERVER_NAME, TOKEN_FILE

CA_KEY_FILE = "ca.key"
CREDENTIALS_FILE = "credentials"
MASTER = "master"
AGENT = "agent"
# The master's built-in job and service frameworks (mesolite/workloads/): a client of the
# master's own gRPC port, with a certificate of its own like any framework.
WORKLOADS = "workloads"
DEFAULT_PRINCIPALS = ("framework", "admin")
# Principals whose certificate also serves TLS (the master's ports, the agent's sandboxes).
SERVERS = frozenset({MASTER, AGENT})
LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1")

CA_DAYS = 3650
DEFAULT_DAYS = 365
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


class CertificateError(MesoliteError):
    """A certificate directory that cannot be written or read as asked; the message says why."""


@dataclass(frozen=True, slots=True)
class Issued:
    """What `init_cluster` or `issue` wrote: one bundle directory per principal."""

    ca: Path
    bundles: dict[str, Path]
    credentials: Path | None = None


def check_principal(name: str) -> str:
    """A principal's name: letters, digits, `.`, `_` and `-`, at most 64 characters
    (it is also a directory name and a certificate CN)."""
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise CertificateError(
            f"bad principal name {name!r}: use letters, digits, '.', '_' and '-' (at most 64)"
        )
    return name


def init_cluster(
    directory: Path,
    *,
    principals: Sequence[str] = DEFAULT_PRINCIPALS,
    hosts: Sequence[str] = (),
    agent_hosts: Sequence[str] = (),
    tokens: Sequence[str] = (),
    days: int = DEFAULT_DAYS,
) -> Issued:
    """A new CA in `directory` and bundles for the master, one agent, the master's built-in
    workload frameworks (`workloads`), `principals`, and a bearer token for each of
    `tokens`. Refuses a directory that already holds a CA."""
    for name in (*principals, *tokens):
        check_principal(name)
    if MASTER in principals or MASTER in tokens:
        raise CertificateError("'master' is the master's own principal; choose another name")
    if (directory / CA_FILE).exists() or (directory / CA_KEY_FILE).exists():
        raise CertificateError(
            f"{directory} already holds a CA; issue more certificates with "
            f"`mesolite certs issue {directory} NAME`, or choose a new directory"
        )
    _make_private_dir(directory)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_certificate(ca_key)
    _write_key(directory / CA_KEY_FILE, ca_key)
    _write_public(directory / CA_FILE, ca_cert.public_bytes(serialization.Encoding.PEM))
    bundles = {
        MASTER: _issue(
            directory, ca_key, ca_cert, MASTER, [MASTER_SERVER_NAME, *LOCAL_HOSTS, *hosts], days
        ),
        AGENT: _issue(directory, ca_key, ca_cert, AGENT, [*LOCAL_HOSTS, *agent_hosts], days),
        WORKLOADS: _issue(directory, ca_key, ca_cert, WORKLOADS, [], days),
    }
    for name in principals:
        if name not in bundles:
            bundles[name] = _issue(directory, ca_key, ca_cert, name, [], days)
    written = add_tokens(directory, tokens) if tokens else None
    _write_public(directory / ACLS_FILE, starter_acls(bundles, tokens).encode())
    return Issued(directory / CA_FILE, bundles, written)


ACLS_FILE = "acls.json"


def starter_acls(principals: Iterable[str], tokens: Iterable[str] = ()) -> str:
    """ACLs (`mesolite master --acls`, format in master/acl.py) for the principals
    `init_cluster` made: only the agent registers agents, and registers no framework;
    the others register frameworks (and submit workloads) in any role, view the state,
    and read their own tasks' output, tear their own frameworks down and kill their own
    tasks (`admin` everyone's, the built-in workloads' included); a framework may name
    as its tasks' user (`FrameworkInfo.user`) only the Unix user of its principal's name
    (which must exist on the agents), and one that names none runs its tasks as each
    agent's `--task-user` (the built-in workloads name none). Edit it to give teams
    their roles and users."""
    agents = [AGENT]
    others = sorted({*principals, *tokens} - {MASTER, AGENT, WORKLOADS})
    own: list[dict[str, object]] = [  # each principal its own frameworks, admin all
        {"principals": {"values": [p]}, "framework_principals": {"values": [p]}}
        for p in others
        if p != "admin"
    ]
    if "admin" in others:
        own.insert(
            0, {"principals": {"values": ["admin"]}, "framework_principals": {"type": "ANY"}}
        )
    acls = {
        "register_frameworks": [
            {"principals": {"values": agents}, "roles": {"type": "NONE"}},
            {"principals": {"type": "ANY"}, "roles": {"type": "ANY"}},
        ],
        "run_tasks": [{"principals": {"values": [p]}, "users": {"values": [p]}} for p in others],
        "register_agents": [{"principals": {"values": agents}}],
        "view_state": [{"principals": {"values": others}}] if others else [],
        "access_sandboxes": own,
        "teardown_frameworks": own,
        "kill_tasks": own,
    }
    return json.dumps(acls, indent=2) + "\n"


def issue(
    directory: Path, name: str, *, hosts: Sequence[str] = (), days: int = DEFAULT_DAYS
) -> Path:
    """One more bundle from the CA in `directory` (made by `init_cluster`). `hosts` make it a
    server certificate too (give them for a second agent on another machine)."""
    check_principal(name)
    if (directory / name / CERT_FILE).exists():
        raise CertificateError(f"{directory / name} already holds a certificate")
    ca_key, ca_cert = _load_ca(directory)
    server_hosts = [*LOCAL_HOSTS, *hosts] if hosts or name in SERVERS else []
    return _issue(directory, ca_key, ca_cert, name, server_hosts, days)


def add_tokens(directory: Path, names: Iterable[str]) -> Path:
    """A new bearer token for each principal in `names`: the token in `DIR/<name>/token`
    (beside the CA certificate that clients verify the master with) and its hash appended to
    `DIR/credentials`, the file the master's `--credentials` reads. Returns that file."""
    names = [check_principal(n) for n in names]
    path = directory / CREDENTIALS_FILE
    known = credentials.load(path) if path.exists() else credentials.Credentials({})
    lines = []
    for name in names:
        if name in known.principals:
            raise CertificateError(f"{path} already has a token for {name!r}")
        token = credentials.new_token()
        bundle = directory / name
        _make_private_dir(bundle)
        _write_secret(bundle / TOKEN_FILE, (token + "\n").encode())
        _write_public(bundle / CA_FILE, (directory / CA_FILE).read_bytes())
        lines.append(credentials.entry(name, token))
    header = "" if path.exists() else credentials.HEADER
    with open(path, "a", encoding="utf-8") as f:
        f.write(header + "".join(lines))
    os.chmod(path, 0o600)
    return path


# Internals ------------------------------------------------------------------------


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _ca_certificate(key: ec.EllipticCurvePrivateKey) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "mesolite cluster CA")])
    now = _now()
    public = key.public_key()
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(ca=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, hashes.SHA256())
    )


def _leaf_certificate(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    key: ec.EllipticCurvePrivateKey,
    principal: str,
    hosts: Sequence[str],
    days: int,
) -> x509.Certificate:
    now = _now()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if hosts:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, principal)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(ca=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if hosts:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([_general_name(h) for h in dict.fromkeys(hosts)]),
            critical=False,
        )
    return builder.sign(ca_key, hashes.SHA256())


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA signs certificates; an ECDSA leaf signs handshakes."""
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return x509.DNSName(host)


def _issue(
    directory: Path,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    principal: str,
    hosts: Sequence[str],
    days: int,
) -> Path:
    if principal != MASTER and MASTER_SERVER_NAME in hosts:
        raise CertificateError(f"only the master's certificate may name {MASTER_SERVER_NAME}")
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _leaf_certificate(ca_key, ca_cert, key, principal, hosts, days)
    bundle = directory / principal
    _make_private_dir(bundle)
    _write_key(bundle / KEY_FILE, key)
    _write_public(bundle / CERT_FILE, cert.public_bytes(serialization.Encoding.PEM))
    _write_public(bundle / CA_FILE, ca_cert.public_bytes(serialization.Encoding.PEM))
    return bundle


def _load_ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    try:
        key = serialization.load_pem_private_key((directory / CA_KEY_FILE).read_bytes(), None)
        cert = x509.load_pem_x509_certificate((directory / CA_FILE).read_bytes())
    except (OSError, ValueError) as e:
        raise CertificateError(
            f"cannot read the CA in {directory} (made by `mesolite certs init`): {e}"
        ) from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise CertificateError(f"{directory / CA_KEY_FILE} is not a key `certs init` made")
    return key, cert


def _make_private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    _write_secret(
        path,
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _write_secret(path: Path, data: bytes) -> None:
    """Created 0600 from the start: never readable by others, not even for a moment."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _write_public(path: Path, data: bytes) -> None:
    path.write_bytes(data)
    os.chmod(path, 0o644)
