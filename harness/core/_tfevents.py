"""TensorBoard event files, written with the standard library only (no tensorflow, tensorboard or protobuf).

A file is a sequence of TFRecords: ``uint64 length | masked crc32c(length) | data | masked crc32c(data)``,
little-endian, where each ``data`` is a serialized ``tensorflow.Event``. Only the fields scalars need are
encoded, by hand::

    Event   { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5; }
    Summary { repeated Value value = 1; }
    Value   { string tag = 1; float simple_value = 2; }

The first record of a file carries ``file_version = "brain.Event:2"``, as TensorFlow's writer does.
"""

from __future__ import annotations

import os
import socket
import struct
import threading
import time

_CRC32C_POLY = 0x82F63B78  # Castagnoli, reflected
_crc_table: list[int] = []  # built on first use: importing this module stays cheap


def _table() -> list[int]:
    if not _crc_table:
        for n in range(256):
            c = n
            for _ in range(8):
                c = (c >> 1) ^ _CRC32C_POLY if c & 1 else c >> 1
            _crc_table.append(c)
    return _crc_table


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``, table-driven."""
    table = _table()
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The CRC that TFRecord stores: rotated right by 15 bits plus a constant, so CRCs of CRCs look random."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    """``data`` framed as one TFRecord."""
    length = struct.pack("<Q", len(data))
    return b"".join(
        (length, struct.pack("<I", masked_crc32c(length)), data, struct.pack("<I", masked_crc32c(data)))
    )


# -- protobuf, the few wire types needed --------------------------------------------------------------
def _varint(n: int) -> bytes:
    if n < 0:
        n += 1 << 64  # int64 as two's complement: ten bytes
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(payload)) + payload


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # finite in float64, out of float32's range: what a cast to float32 gives
        return struct.pack("<f", float("inf") if value > 0 else float("-inf"))


def scalar_value(tag: str, value: float) -> bytes:
    """A serialized ``Summary.Value`` with ``simple_value``."""
    return _length_delimited(1, tag.encode()) + b"\x15" + _float32(value)  # 0x15: field 2, 32-bit


def event(
    wall_time: float, step: int = 0, *, file_version: str = "", values: list[bytes] | None = None
) -> bytes:
    """A serialized ``Event``; ``values`` are serialized ``Summary.Value`` messages."""
    out = b"\x09" + struct.pack("<d", wall_time)  # field 1, 64-bit
    if step:
        out += b"\x10" + _varint(step)  # field 2, varint
    if file_version:
        out += _length_delimited(3, file_version.encode())
    if values is not None:
        out += _length_delimited(5, b"".join(_length_delimited(1, v) for v in values))
    return out


def _number(value: object) -> float | None:
    """``value`` as a float, or None when it is no number (bools, strings, lists, dicts, None)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:  # an int beyond float64
        return float("inf") if value > 0 else float("-inf")


class EventsWriter:
    """Appends scalar events to one ``events.out.tfevents.*`` file in ``directory``.

    The directory and the file are created on the first write, so a writer that never writes leaves nothing
    behind. Records are buffered in memory up to ``buffer_bytes``; ``flush()`` writes them out, making them
    visible to TensorBoard. Thread-safe.
    """

    _files_opened = 0  # the trailing counter of file names, unique within the process
    _count_lock = threading.Lock()

    def __init__(self, directory: str | os.PathLike[str], *, buffer_bytes: int = 1 << 16) -> None:
        self.directory = os.fspath(directory)
        self.path: str | None = None
        self._buffer_bytes = buffer_bytes
        self._fd: int | None = None
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._lock = threading.Lock()
        self._closed = False

    def add_scalars(self, step: int, scalars: dict[str, object], wall_time: float | None = None) -> None:
        """One event at ``step`` holding every numeric value of ``scalars``; the others are skipped.

        NaN and infinities are written (TensorBoard shows them); values are stored as float32.
        """
        values = [scalar_value(tag, x) for tag, v in scalars.items() if (x := _number(v)) is not None]
        if not values:
            return
        record = tfrecord(event(time.time() if wall_time is None else wall_time, int(step), values=values))
        with self._lock:
            if self._closed:
                raise ValueError("events writer is closed")
            if self._fd is None:
                self._open_locked()
            self._buffer.append(record)
            self._buffered += len(record)
            if self._buffered >= self._buffer_bytes:
                self._write_locked()

    def flush(self) -> None:
        with self._lock:
            self._write_locked()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                self._write_locked()
            finally:
                if self._fd is not None:
                    os.close(self._fd)
                    self._fd = None

    def _open_locked(self) -> None:
        os.makedirs(self.directory, mode=0o750, exist_ok=True)
        with EventsWriter._count_lock:
            n = EventsWriter._files_opened
            EventsWriter._files_opened += 1
        now = time.time()
        # ".det<n>", not torch's ".<n>": a SummaryWriter opened in the same second by the same process (a
        # user's, on get_tensorboard_path()) would otherwise truncate this very file.
        path = os.path.join(
            self.directory, f"events.out.tfevents.{int(now)}.{socket.gethostname()}.{os.getpid()}.det{n}"
        )
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
        self.path = path
        first = tfrecord(event(now, file_version="brain.Event:2"))
        self._buffer.append(first)
        self._buffered += len(first)

    def _write_locked(self) -> None:
        if self._fd is None or not self._buffer:
            return
        data = memoryview(b"".join(self._buffer))
        self._buffer.clear()
        self._buffered = 0
        while data:
            data = data[os.write(self._fd, data) :]
