"""The one stream writer (`mesolite/stream_writer.py`) that every stream end uses."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

import pytest

from mesolite.stream_writer import StreamWriter, in_batches

pytestmark = pytest.mark.unit


async def drained(writer: StreamWriter[int]) -> list[int]:
    return [m async for m in writer.drain()]


@dataclass
class FakeCall:
    """The writing half of a client stream; `fail_at` makes that write raise."""

    fail_at: int | None = None
    written: list[int] = field(default_factory=list)
    half_closed: bool = False

    async def write(self, message: int) -> None:
        if message == self.fail_at:
            raise ConnectionError("the stream broke")
        await asyncio.sleep(0)
        self.written.append(message)

    async def done_writing(self) -> None:
        self.half_closed = True


async def test_messages_come_out_in_order_and_close_waits_for_them() -> None:
    writer: StreamWriter[int] = StreamWriter(10)
    for m in range(3):
        writer.send(m)
    writer.close("done")
    assert (writer.closed, writer.close_reason, writer.overflowed) == (True, "done", False)
    assert await drained(writer) == [0, 1, 2]


async def test_drain_waits_for_messages_until_closed() -> None:
    writer: StreamWriter[int] = StreamWriter(10)
    reader = asyncio.create_task(drained(writer))
    await asyncio.sleep(0)
    writer.send(1)
    await asyncio.sleep(0)
    writer.send(2)
    assert not reader.done()
    writer.close()
    assert await reader == [1, 2]


async def test_send_on_a_full_queue_closes_the_stream_instead_of_waiting() -> None:
    writer: StreamWriter[int] = StreamWriter(2)
    for m in range(4):
        writer.send(m)
    assert writer.overflowed and writer.closed
    assert writer.close_reason == "the peer is not reading its messages"
    assert await drained(writer) == [0, 1]  # what was queued before still goes out


async def test_nothing_is_queued_after_close() -> None:
    writer: StreamWriter[int] = StreamWriter(5)
    writer.send(1)
    writer.close("first")
    writer.close("second")
    writer.send(2)
    await writer.put(3)  # returns at once
    assert writer.close_reason == "first" and not writer.overflowed
    assert await drained(writer) == [1]


async def test_put_waits_for_room_and_keeps_the_order() -> None:
    writer: StreamWriter[int] = StreamWriter(2)
    senders = [asyncio.create_task(writer.put(m)) for m in range(5)]
    await asyncio.sleep(0)
    assert len(writer) == 2 and not writer.closed
    assert sum(s.done() for s in senders) == 2
    out = []
    async for message in writer.drain():
        out.append(message)
        assert len(writer) <= 2
        if len(out) == 5:
            break
    await asyncio.gather(*senders)
    assert out == [0, 1, 2, 3, 4]


async def test_close_releases_a_put_waiting_for_room_and_drops_its_message() -> None:
    writer: StreamWriter[int] = StreamWriter(1)
    await writer.put(1)
    waiting = asyncio.create_task(writer.put(2))
    await asyncio.sleep(0)
    assert not waiting.done()
    writer.close()
    await asyncio.wait_for(waiting, 1)
    assert await drained(writer) == [1]


async def test_write_to_writes_everything_then_half_closes() -> None:
    writer: StreamWriter[int] = StreamWriter(2)
    call = FakeCall()
    task = asyncio.create_task(writer.write_to(call))
    for m in range(5):
        await writer.put(m)
    writer.close()
    await asyncio.wait_for(task, 1)
    assert call.written == [0, 1, 2, 3, 4] and call.half_closed


async def test_after_a_failed_write_the_rest_is_discarded_and_senders_never_block() -> None:
    writer: StreamWriter[int] = StreamWriter(2)
    call = FakeCall(fail_at=1)
    task = asyncio.create_task(writer.write_to(call))
    async with asyncio.timeout(1):
        for m in range(10):
            await writer.put(m)
        writer.close()
        await task
    assert call.written == [0] and not call.half_closed


def test_a_writer_needs_room_for_a_message() -> None:
    with pytest.raises(ValueError):
        StreamWriter(0)


async def test_drain_batches_takes_what_waits_up_to_the_limit() -> None:
    writer: StreamWriter[int] = StreamWriter(100)
    for i in range(5):
        writer.send(i)
    batches = writer.drain_batches(limit=3)
    assert await anext(batches) == [0, 1, 2]
    assert await anext(batches) == [3, 4]
    writer.send(5)
    writer.close()
    assert [b async for b in batches] == [[5]]
    with pytest.raises(ValueError):
        await anext(writer.drain_batches(limit=0))


@dataclass(frozen=True)
class Sized:
    name: str
    size: int = 10

    def ByteSize(self) -> int:
        return self.size


def test_in_batches_wraps_runs_within_the_size_and_leaves_alone_what_must_be() -> None:
    def wrap(run: list[Sized]) -> Sized:
        return Sized("+".join(m.name for m in run), sum(m.size for m in run))

    messages = [Sized("first"), Sized("a"), Sized("b"), Sized("big", 50), Sized("c"), Sized("d")]
    out = in_batches(messages, wrap, alone=lambda m: m.name == "first", limit_bytes=40)
    assert [m.name for m in out] == ["first", "a+b", "big", "c+d"]
    assert [m.name for m in in_batches([Sized("x")], wrap)] == ["x"]


async def test_an_idle_stream_does_not_linger() -> None:
    writer: StreamWriter[int] = StreamWriter(100)
    batches = writer.drain_batches(limit=100, linger=30.0)
    writer.send(0)
    async with asyncio.timeout(5):  # far below the linger
        assert await anext(batches) == [0]


async def test_a_busy_stream_lingers_to_fill_its_next_batch() -> None:
    writer: StreamWriter[int] = StreamWriter(100)
    # A long linger, ended by a full batch: the test never waits on the clock.
    batches = writer.drain_batches(limit=3, linger=30.0)
    writer.send(0)
    assert await anext(batches) == [0]
    writer.send(1)  # right after a batch was taken: the writer is busy
    taking = asyncio.ensure_future(anext(batches))
    for _ in range(5):
        await asyncio.sleep(0)  # the writer runs, and finds one message waiting
    assert not taking.done()  # it waits for more
    writer.send(2)
    writer.send(3)
    async with asyncio.timeout(5):
        assert await taking == [1, 2, 3]


async def test_lingering_ends_when_the_batch_is_full_or_the_stream_closes() -> None:
    writer: StreamWriter[int] = StreamWriter(100)
    batches = writer.drain_batches(limit=2, linger=30.0)
    writer.send(0)
    assert await anext(batches) == [0]
    writer.send(1)
    writer.send(2)
    async with asyncio.timeout(5):
        assert await anext(batches) == [1, 2]  # full: no waiting for the linger
        writer.send(3)
        taking = asyncio.ensure_future(anext(batches))
        await asyncio.sleep(0)
        writer.close()
        assert await taking == [3]
