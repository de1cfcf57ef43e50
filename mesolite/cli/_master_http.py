"""Talking to a master's HTTP port from the CLI: `GET /state` for the views, the
operator API's `POST /api/v1/...` for `mesolite teardown|kill`.

One place builds the URL (http, or https with `--tls-dir`), presents the client's
certificate or bearer token, and turns every failure into a `MasterUnreachable`
(the master could not be asked) or a `MasterRefused` (it answered no, and why),
each with a message that says what to do.
"""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from typing import Any

from mesolite.errors import MesoliteError
from mesolite.tls import MASTER_SERVER_NAME
from mesolite.tls_options import PLAINTEXT, ClientAuth

TIMEOUT = 10.0
NOT_A_MASTER = "is that a mesolite master's HTTP address (its --http-port)?"
_MAX_ERROR = 2000  # characters of a refusal's body shown


class MasterUnreachable(MesoliteError):
    """The master could not be asked; the message says why and what to do."""


class MasterRefused(MesoliteError):
    """The master answered with an error status; the message is its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def base_url(address: str, auth: ClientAuth) -> str:
    if address.startswith(("http://", "https://")):
        return address.rstrip("/")
    return f"{'https' if auth.tls else 'http'}://{address}"


def request_json(
    address: str,
    path: str,
    auth: ClientAuth = PLAINTEXT,
    *,
    method: str = "GET",
    body: Any = None,
) -> Any:
    """The JSON the master answers `method path` with (`body`, when given, sent as
    JSON). Raises `MasterUnreachable` or `MasterRefused`. `address` may list highly
    available masters (`h1:5051,h2:5051`): a standby's 307 is followed to the leader,
    and a master that cannot be reached (or has no leader to name, 503) is passed over
    for the next."""
    addresses = [a.strip() for a in address.split(",") if a.strip()] or [address]
    for i, one in enumerate(addresses):
        try:
            return _request_one(one, path, auth, method=method, body=body)
        except MasterUnreachable:
            if i == len(addresses) - 1:
                raise
        except MasterRefused as e:
            if e.status != 503 or i == len(addresses) - 1:
                raise
    raise AssertionError("unreachable")


def _request_one(
    address: str, path: str, auth: ClientAuth, *, method: str, body: Any, hops: int = 0
) -> Any:
    url = f"{base_url(address, auth)}{path}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        request.add_header("Content-Type", "application/json")
    context: ssl.SSLContext | None = None
    if auth.tls is not None:
        # The master's own name, not the address: an agent's certificate for the
        # same host must not pass for the master's.
        context = auth.tls.client_context(server_name=MASTER_SERVER_NAME)
    if auth.token is not None:
        request.add_header("Authorization", f"Bearer {auth.token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT, context=context) as response:
            return json.load(response)
    except urllib.error.HTTPError as e:
        location = e.headers.get("Location", "")
        if e.code == 307 and hops == 0 and location.startswith(("http://", "https://")):
            # A standby names the leader (urllib follows 307 only for GET).
            e.close()
            leader = location[: len(location) - len(path)] if location.endswith(path) else ""
            if leader:
                return _request_one(leader, path, auth, method=method, body=body, hops=1)
        raise _refused(url, e) from None
    except (urllib.error.URLError, OSError) as e:
        reason = e.reason if isinstance(e, urllib.error.URLError) else e
        tls_hint = "" if auth.tls else " If it uses TLS, give --tls-dir (or MESOLITE_TLS_DIR)."
        raise MasterUnreachable(
            f"cannot reach the master at {address}: {reason}. Is it running? "
            "Start one with `mesolite master`, or give its address with --master HOST:HTTP_PORT."
            + tls_hint
        ) from None
    except ValueError:  # not JSON, or not UTF-8
        raise MasterUnreachable(f"{url} did not answer JSON: {NOT_A_MASTER}") from None


def _refused(url: str, e: urllib.error.HTTPError) -> MasterRefused:
    try:
        text = e.read(_MAX_ERROR * 4).decode(errors="replace")
    except OSError:
        text = ""
    finally:
        e.close()
    if e.code == 401:
        return MasterRefused(
            401,
            f"{url} answered 401: the master wants a principal. Give --tls-dir (a bundle "
            "from `mesolite certs init`), or a token with --token-file",
        )
    reason = _reason(text)
    if e.code == 403:
        return MasterRefused(403, f"refused by the master's ACLs (403): {reason}")
    if e.code == 404 and not reason:
        return MasterRefused(404, f"{url} answered 404: {NOT_A_MASTER}")
    return MasterRefused(e.code, reason or f"{url} answered {e.code} {e.reason}")


def _reason(text: str) -> str:
    """The refusal's reason: the operator API's `{"error": ...}`, else the text."""
    try:
        body = json.loads(text)
    except ValueError:
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), str):
        text = body["error"]
    return " ".join(text.split())[:_MAX_ERROR]


__all__ = [
    "MasterRefused",
    "MasterUnreachable",
    "base_url",
    "request_json",
]
