"""Bearer tokens, for clients that cannot hold a certificate.

The master's `--credentials FILE` lists one principal per line with the SHA-256 of its
token, never the token itself:

    # principal  sha256:<hex digest of the token>
    ci           sha256:3f0c...e9

`mesolite certs init DIR --token ci` (or `certs token DIR ci`) makes a random token, writes
it to `DIR/ci/token` for the client and its line here. Tokens are 256-bit random strings,
so an unsalted hash is enough; a presented token is hashed and compared with every entry in
constant time (`hmac.compare_digest`, no early exit). A client sends it as
`authorization: Bearer <token>` (gRPC metadata or HTTP header), and only over TLS.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from mesolite.errors import MesoliteError

HEADER = "# principal  sha256:<hex digest of the token> (mesolite credentials)\n"
_LINE = re.compile(r"(?P<principal>\S+)\s+sha256:(?P<digest>[0-9a-f]{64})")
_BEARER = re.compile(r"Bearer +(?P<token>[A-Za-z0-9._~+/=-]+) *", re.IGNORECASE)
MAX_TOKEN_LENGTH = 512


class CredentialsError(MesoliteError, ValueError):
    """A credentials file that cannot be read; the message names the file and line."""


def new_token() -> str:
    return secrets.token_urlsafe(32)


def digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


def entry(principal: str, token: str) -> str:
    """The credentials-file line for `principal` holding `token`."""
    return f"{principal} sha256:{digest(token).hex()}\n"


@dataclass(frozen=True, slots=True)
class Credentials:
    """Principals by the SHA-256 of their token."""

    digests: Mapping[str, bytes]  # principal -> sha256(token)

    @property
    def principals(self) -> frozenset[str]:
        return frozenset(self.digests)

    def principal_of(self, token: str) -> str | None:
        """The principal holding `token`, or None. Every entry is compared, in constant
        time, whether or not one matched."""
        presented = digest(token)
        found = None
        for principal, known in self.digests.items():
            if hmac.compare_digest(presented, known):
                found = principal
        return found


NO_CREDENTIALS = Credentials({})


def parse(text: str, source: str = "credentials") -> Credentials:
    digests: dict[str, bytes] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            raise CredentialsError(
                f"{source}:{number}: expected 'PRINCIPAL sha256:<64 hex digits>'"
            )
        principal = match["principal"]
        if principal in digests:
            raise CredentialsError(f"{source}:{number}: {principal!r} appears twice")
        digests[principal] = bytes.fromhex(match["digest"])
    return Credentials(digests)


def load(path: Path) -> Credentials:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CredentialsError(f"cannot read the credentials file {path}: {e}") from None
    return parse(text, str(path))


def bearer_token(header: str | None) -> str | None:
    """The token in an `Authorization: Bearer <token>` value; None when absent or malformed."""
    if not header or len(header) > MAX_TOKEN_LENGTH + 16:
        return None
    match = _BEARER.fullmatch(header)
    return match["token"] if match else None
