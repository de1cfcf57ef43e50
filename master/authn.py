"""Who is calling: the principal of every gRPC call and HTTP request, or a refusal.

Authentication is on when the master has TLS (`MasterConfig.tls`). A principal is then
  - the CN of the client certificate the connection presented, verified against the
    cluster's CA during the TLS handshake (gRPC: `auth_context()["x509_common_name"]`;
    HTTP: the TLS socket's peer certificate); or, on a connection without one,
  - the principal of a bearer token (`authorization: Bearer <token>`) listed in the
    credentials file (`MasterConfig.credentials_file`, mesolite/credentials.py).
A call with neither is refused before any handler runs: gRPC `UNAUTHENTICATED` (the
interceptor), HTTP 401 (the middleware), on every method and route. Without TLS every
call is anonymous (principal None), as before; the master then listens only on loopback
unless told `--insecure` (`mesolite.tls.check_listen`).

On the gRPC port a certificate is required by the handshake itself (a client without
one, or with one from another CA, never gets a stream); bearer tokens are accepted on the
token port (`MasterServer(token_port=...)`), which does not ask for certificates. HTTP
asks for a certificate, verifies it when given, and accepts a token otherwise.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import structlog
from aiohttp import web
from aiohttp.typedefs import Middleware

from mesolite import credentials
from mesolite.tls import peer_principal

log = structlog.get_logger(__name__)

PRINCIPAL_KEY = web.RequestKey("principal", str)  # the caller of an HTTP request, when known
_REFUSAL_WAIT = 1.0  # seconds a refused stream may take to send its first message
_CHALLENGE = {"WWW-Authenticate": 'Bearer realm="mesolite"'}


class Authenticator:
    """Finds the principal of a call; `enabled` says whether one is required."""

    def __init__(self, enabled: bool, credentials_file: Path | None = None) -> None:
        self.enabled = enabled
        self._file = credentials_file
        self._credentials = (
            credentials.load(credentials_file) if credentials_file else credentials.NO_CREDENTIALS
        )
        # Open streams authenticated by a token: its header, and how to end the stream.
        self._watched: dict[object, tuple[str, Callable[[str], None]]] = {}

    def reload(self) -> None:
        """Read the credentials file again (SIGHUP); keeps the old tokens if it is bad.
        Streams opened with a token the new file no longer has are ended."""
        if self._file is None:
            return
        try:
            self._credentials = credentials.load(self._file)
        except credentials.CredentialsError as e:
            log.error("credentials not reloaded; keeping the previous ones", reason=str(e))
            return
        log.info("credentials reloaded", principals=len(self._credentials.principals))
        for key, (header, end) in list(self._watched.items()):
            if self._of_token(header) is None:
                del self._watched[key]
                log.warning("ending a stream: its token was revoked")
                end("its token was revoked")

    def watch(
        self, context: grpc.aio.ServicerContext[Any, Any], end: Callable[[str], None]
    ) -> Callable[[], None]:
        """Remember an open stream authenticated by a token: `end(reason)` is called if a
        reload revokes the token. Returns what forgets the stream (when it ends by
        itself). A certificate cannot be revoked short of a new CA."""
        if not self.enabled or context.auth_context().get("x509_common_name"):
            return _nothing
        return self._watch_token(_authorization(context), end)

    def watch_request(self, request: web.Request, end: Callable[[str], None]) -> Callable[[], None]:
        """As `watch`, for a long-lived HTTP response (a Mesos framework's subscription):
        `end(reason)` if a reload revokes the token the request was authenticated by."""
        if not self.enabled or peer_principal(request.transport) is not None:
            return _nothing
        headers = request.headers.getall("Authorization", [])
        return self._watch_token(headers[0] if len(headers) == 1 else None, end)

    def _watch_token(self, header: str | None, end: Callable[[str], None]) -> Callable[[], None]:
        if header is None:
            return _nothing
        key = object()
        self._watched[key] = (header, end)

        def forget() -> None:
            self._watched.pop(key, None)

        return forget

    def _of_token(self, header: str | None) -> str | None:
        token = credentials.bearer_token(header)
        return None if token is None else self._credentials.principal_of(token)

    # gRPC ----------------------------------------------------------------------------

    def grpc_principal(self, context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
        """The caller's principal; None when anonymous (authentication off) or unknown."""
        if not self.enabled:
            return None
        names = context.auth_context().get("x509_common_name", [])
        if names:
            return names[0].decode() if len(names) == 1 else None
        return self._of_token(_authorization(context))

    async def grpc_caller(
        self,
        context: grpc.aio.ServicerContext[Any, Any],
        requests: AsyncIterator[Any] | None = None,
    ) -> str | None:
        """The caller's principal (None when authentication is off); with authentication on,
        a call without one is aborted with UNAUTHENTICATED. For a stream of `requests` the
        refusal waits for its first message, at most `_REFUSAL_WAIT` seconds: a grpcio
        client whose first write races the refusal reports INTERNAL instead of the status,
        and a refused framework or agent should know it was refused. Nothing in the message
        is looked at."""
        principal = self.grpc_principal(context)
        if principal is None and self.enabled:
            if requests is not None:
                with contextlib.suppress(Exception):  # whatever it sent, or nothing
                    async with asyncio.timeout(_REFUSAL_WAIT):
                        await anext(aiter(requests))
            log.info("gRPC call refused: no principal", peer=context.peer())
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "authenticate with a client certificate from this cluster's CA, or a bearer "
                "token on the token port",
            )
        return principal

    def interceptor(self) -> grpc.aio.ServerInterceptor:
        return _AuthInterceptor(self)

    # HTTP ----------------------------------------------------------------------------

    def http_principal(self, request: web.Request) -> str | None:
        if not self.enabled:
            return None
        principal = peer_principal(request.transport)
        if principal is not None:
            return principal
        headers = request.headers.getall("Authorization", [])
        return self._of_token(headers[0]) if len(headers) == 1 else None

    @staticmethod
    def request_principal(request: web.Request) -> str | None:
        """The principal the middleware found for `request` (None: anonymous)."""
        return request.get(PRINCIPAL_KEY)

    def middleware(self) -> Middleware:
        @web.middleware
        async def authenticate(
            request: web.Request,
            handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        ) -> web.StreamResponse:
            if self.enabled:
                principal = self.http_principal(request)
                if principal is None:
                    log.info("HTTP request refused: no principal", path=request.path[:200])
                    raise web.HTTPUnauthorized(
                        text="authenticate with a client certificate from this cluster's CA "
                        "or an 'Authorization: Bearer' token\n",
                        headers=_CHALLENGE,
                    )
                request[PRINCIPAL_KEY] = principal
            return await handler(request)

        return authenticate


class _AuthInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Refuses every call without a principal before its handler runs, whatever the method
    (streams included: the handler never sees a message of a refused call)."""

    def __init__(self, authenticator: Authenticator) -> None:
        self._authn = authenticator

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None or not self._authn.enabled:
            return handler
        return _guarded(handler, self._authn)


def _guarded(handler: grpc.RpcMethodHandler, authn: Authenticator) -> grpc.RpcMethodHandler:
    streamed = handler.request_streaming

    async def check(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await authn.grpc_caller(context, request if streamed else None)

    kwargs = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    single = handler.unary_unary or handler.stream_unary
    if single is not None:

        async def one_response(request: Any, context: Any) -> Any:
            await check(request, context)
            return await single(request, context)

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(one_response, **kwargs)
        return grpc.stream_unary_rpc_method_handler(one_response, **kwargs)
    streaming = handler.unary_stream or handler.stream_stream
    if inspect.isasyncgenfunction(streaming):

        async def responses(request: Any, context: Any) -> AsyncIterator[Any]:
            await check(request, context)
            async for response in streaming(request, context):
                yield response

        wrapped: Callable[..., Any] = responses
    else:  # writes with context.write() and returns

        async def writes(request: Any, context: Any) -> None:
            await check(request, context)
            await streaming(request, context)

        wrapped = writes
    if handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(wrapped, **kwargs)
    return grpc.stream_stream_rpc_method_handler(wrapped, **kwargs)


def _nothing() -> None:
    return None


def _authorization(context: grpc.aio.ServicerContext[Any, Any]) -> str | None:
    """The call's `authorization` header; None if absent or given twice (then neither)."""
    header = None
    for key, value in context.invocation_metadata() or ():
        if key == "authorization":
            if header is not None:
                return None
            header = value if isinstance(value, str) else None
    return header
