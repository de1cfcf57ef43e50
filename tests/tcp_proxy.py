"""A TCP proxy a test can cut: a real network partition between two processes on loopback.

    async with TcpProxy(target="127.0.0.1:5050") as proxy:
        ...  # point the agent at proxy.address
        await proxy.cut()   # open connections reset, new ones refused
        proxy.heal()        # connections accepted again

While cut, the listening socket stays bound (so the address stays valid) but
every new connection is closed at once, and the connections that were open
are aborted, as a peer behind a broken link would see them.
"""

from __future__ import annotations

import asyncio
import contextlib
from types import TracebackType


class TcpProxy:
    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._pumps: set[asyncio.Task[None]] = set()
        self._handlers: set[asyncio.Task[None]] = set()
        self.partitioned = False
        self.connections = 0  # accepted and forwarded, over the proxy's life

    @property
    def address(self) -> str:
        assert self._server is not None
        host, port = self._server.sockets[0].getsockname()[:2]
        return f"{host}:{port}"

    async def __aenter__(self) -> TcpProxy:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(
        self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._server is not None
        self._server.close()
        await self.cut()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await self._server.wait_closed()

    async def cut(self) -> None:
        """Partition: abort every open connection and refuse new ones until `heal()`."""
        self.partitioned = True
        for writer in list(self._writers):
            writer.transport.abort()
        for pump in list(self._pumps):
            pump.cancel()
        await asyncio.gather(*self._pumps, return_exceptions=True)

    def heal(self) -> None:
        self.partitioned = False

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            await self._forward(reader, writer)
        finally:
            self._handlers.discard(handler)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.partitioned:
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.transport.abort()
            return
        self.connections += 1
        self._writers.update((writer, up_writer))
        pumps = [
            asyncio.create_task(self._pump(reader, up_writer)),
            asyncio.create_task(self._pump(up_reader, writer)),
        ]
        self._pumps.update(pumps)
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            self._pumps.difference_update(pumps)
            for w in (writer, up_writer):
                self._writers.discard(w)
                w.transport.abort()

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError):
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
