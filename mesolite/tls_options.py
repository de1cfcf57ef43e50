"""The TLS options of every command that talks to a master, and the environment variables
behind them: one place, so `mesolite agent`, `mesolite state` and the examples agree.

    --tls-dir DIR        a bundle `mesolite certs init` wrote (ca.crt, tls.crt, tls.key,
                         or ca.crt and token); env MESOLITE_TLS_DIR
    --ca/--cert/--key    the same files named one by one (instead of --tls-dir)
    --token-file FILE    a bearer token, for a client without a certificate;
                         env MESOLITE_TOKEN (the token itself) or MESOLITE_TOKEN_FILE

A flag wins over its environment variable. A token is used only with TLS (a CA to verify
the master with); a token file beside the CA in a bundle is picked up by --tls-dir.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mesolite.tls import TOKEN_FILE, TlsConfig, TlsError

TLS_DIR_ENV = "MESOLITE_TLS_DIR"
TOKEN_ENV = "MESOLITE_TOKEN"
TOKEN_FILE_ENV = "MESOLITE_TOKEN_FILE"


@dataclass(frozen=True, slots=True)
class ClientAuth:
    """How a client connects: TLS files (None: plaintext) and a bearer token, if any."""

    tls: TlsConfig | None = None
    token: str | None = field(default=None, repr=False)


PLAINTEXT = ClientAuth()  # no TLS, no token


def add_file_options(group: Any, bundle_help: str) -> None:
    """--tls-dir, or --ca, --cert and --key, on an argparse parser or group."""
    group.add_argument("--tls-dir", type=Path, metavar="DIR", help=bundle_help)
    group.add_argument("--ca", type=Path, metavar="FILE", help="CA certificate (PEM)")
    group.add_argument("--cert", type=Path, metavar="FILE", help="certificate (PEM)")
    group.add_argument("--key", type=Path, metavar="FILE", help="its private key (PEM)")


def tls_config(args: argparse.Namespace, default_dir: Path | None = None) -> TlsConfig | None:
    """The `TlsConfig` that --tls-dir or --ca/--cert/--key name (else `default_dir`)."""
    if args.ca is not None:
        if args.tls_dir is not None:
            raise TlsError("give --tls-dir or --ca/--cert/--key, not both")
        return TlsConfig(args.ca, args.cert, args.key)
    if args.cert is not None or args.key is not None:
        raise TlsError("--cert and --key need --ca (the CA to verify peers with)")
    tls_dir = args.tls_dir or default_dir
    return TlsConfig.from_dir(tls_dir) if tls_dir is not None else None


def add_client_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("TLS and authentication (mesolite certs init)")
    add_file_options(
        group,
        f"this client's bundle: ca.crt with tls.crt/tls.key or a token (env {TLS_DIR_ENV})",
    )
    group.add_argument(
        "--token-file",
        type=Path,
        metavar="FILE",
        help=f"bearer token, for a client without a certificate (env {TOKEN_ENV} or "
        f"{TOKEN_FILE_ENV})",
    )


def client_auth(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> ClientAuth:
    """The `ClientAuth` the options (or else the environment) ask for."""
    tls_dir = args.tls_dir or (Path(environ[TLS_DIR_ENV]) if environ.get(TLS_DIR_ENV) else None)
    tls = tls_config(args, tls_dir)
    token = _token(args.token_file, environ, None if args.ca else tls_dir)
    if token is not None and tls is None:
        raise TlsError("a bearer token is sent only over TLS: give --tls-dir or --ca too")
    return ClientAuth(tls, token)


def _token(token_file: Path | None, environ: Mapping[str, str], tls_dir: Path | None) -> str | None:
    if token_file is None and environ.get(TOKEN_ENV):
        return environ[TOKEN_ENV].strip()
    if token_file is None and environ.get(TOKEN_FILE_ENV):
        token_file = Path(environ[TOKEN_FILE_ENV])
    if token_file is None and tls_dir is not None and (tls_dir / TOKEN_FILE).is_file():
        token_file = tls_dir / TOKEN_FILE
    if token_file is None:
        return None
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as e:
        raise TlsError(f"cannot read the token file {token_file}: {e}") from None
    if not token:
        raise TlsError(f"the token file {token_file} is empty")
    return token
