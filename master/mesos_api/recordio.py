"""RecordIO, Mesos' framing of an event stream: each record is its length in bytes, in
decimal ASCII, a newline, then the record itself (`docs/recordio.md` in Mesos), back
to back with nothing between them."""

from __future__ import annotations

from mesolite.master.errors import MasterError

MAX_LENGTH_DIGITS = 20  # a 64-bit unsigned length


class RecordIOError(MasterError, ValueError):
    """Bytes that are not RecordIO."""


def encode(record: bytes) -> bytes:
    """One record, framed. Mesos never sends an empty one."""
    if not record:
        raise ValueError("a RecordIO record is never empty")
    return b"%d\n%b" % (len(record), record)


class Decoder:
    """Records from a byte stream fed in pieces of any size; records longer than
    `max_record` bytes are refused (a reader must bound what it buffers)."""

    def __init__(self, max_record: int = 16 << 20) -> None:
        self._buffer = bytearray()
        self._max = max_record

    def feed(self, data: bytes) -> list[bytes]:
        self._buffer += data
        records: list[bytes] = []
        while True:
            newline = self._buffer.find(b"\n", 0, MAX_LENGTH_DIGITS + 1)
            if newline < 0:
                if len(self._buffer) > MAX_LENGTH_DIGITS:
                    raise RecordIOError("no record length in the first 20 bytes")
                return records
            digits = bytes(self._buffer[:newline])
            if not digits.isdigit():
                raise RecordIOError(f"not a record length: {digits[:20]!r}")
            length = int(digits)
            if length == 0 or length > self._max:
                raise RecordIOError(f"record length {length} outside 1..{self._max}")
            end = newline + 1 + length
            if len(self._buffer) < end:
                return records
            records.append(bytes(self._buffer[newline + 1 : end]))
            del self._buffer[:end]

    @property
    def pending(self) -> int:
        """Bytes received that are not yet a whole record."""
        return len(self._buffer)
