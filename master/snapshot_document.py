"""The bodies of GET /state and GET /metrics, made without holding the event loop.

The snapshot must be taken on the loop (it reads the core, which the loop
changes), and that is all that is done there: `build_snapshot` is one pass over
the master's records. Turning the snapshot into JSON is most of the cost on a
large cluster (2,000 frameworks, 500 agents: ~0.1-0.2 s of `to_json` and
`json.dumps`, which held the loop for as long per request, and eight requests
at once for eight times that), so it happens in a worker thread, on the
immutable snapshot, in pieces: `encode_json` encodes each framework, agent,
task ... with its own `json.dumps` call, so the thread gives the interpreter
lock back to the loop between pieces (one call over the whole document would
keep it for the whole encoding).

GET /metrics is made the same way: the snapshot on the loop, the exposition
text from it (`MasterMetrics.exposition`) in a worker thread.

Requests share work without ever getting an answer older than themselves:
at most one document is encoded at a time, and every request that arrives
before the next snapshot is taken shares that snapshot. A request never waits
for more than the encoding under way and its own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

from mesolite.snapshot import ClusterSnapshot

_SEPARATORS = (",", ":")
_SPLIT_DEPTH = 2  # the document, its lists (frameworks, agents, ...), and their items


def encode_json(value: Any) -> bytes:
    """`json.dumps(value)` (compact), encoded item by item down to `_SPLIT_DEPTH`."""
    pieces: list[str] = []
    _encode(value, 0, pieces)
    return "".join(pieces).encode()


def _encode(value: Any, depth: int, out: list[str]) -> None:
    if depth < _SPLIT_DEPTH and isinstance(value, dict):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            out.append(("," if i else "") + json.dumps(str(key)) + ":")
            _encode(item, depth + 1, out)
        out.append("}")
    elif depth < _SPLIT_DEPTH and isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, depth + 1, out)
        out.append("]")
    else:
        out.append(json.dumps(value, separators=_SEPARATORS))


def encode_state(snapshot: ClusterSnapshot) -> bytes:
    """The GET /state body (blocking: call it in a worker thread)."""
    return encode_json(snapshot.to_json())


class SnapshotDocument:
    """A document made from a snapshot of the cluster by `encode` (GET /state's JSON by
    default), as the module docstring says."""

    def __init__(
        self,
        snapshot: Callable[[], ClusterSnapshot],
        encode: Callable[[ClusterSnapshot], bytes] = encode_state,
    ) -> None:
        self._snapshot = snapshot
        self._encode = encode
        self._next: asyncio.Future[bytes] | None = None  # its snapshot not taken yet
        self._encoding = asyncio.Lock()
        self.builds = 0

    async def body(self) -> bytes:
        """The cluster's state, as of a moment after this call."""
        if self._next is None:
            self._next = asyncio.ensure_future(self._build())
        # Shielded: a client that goes away does not cancel what others wait for.
        return await asyncio.shield(self._next)

    async def _build(self) -> bytes:
        async with self._encoding:
            self._next = None  # from here on, a request needs a later snapshot
            snapshot = self._snapshot()  # on the loop: it reads the core
            self.builds += 1
            return await asyncio.to_thread(self._encode, snapshot)


__all__ = ["SnapshotDocument", "encode_json", "encode_state"]
