"""ArrayStore's logical row drops: the delete log of one array and its live rows.

``drop(name, rows)`` does not move a byte of the array: it appends one record
naming the dropped rows to the array's delete log, ``<root>/.deletes-<name>``,
and the array's `OpenArray` reads through its live rows from then on (a
mask of the kept base rows; the map of live rows is built from it when a
read first needs it). Invariant: the rows a reader sees are the array directory's records
(its "base rows", numbered as the store numbers them) minus every base row a
valid record of the log names, in base order; a log whose header names
another generation than the array directory's schema file is stale (the
directory was replaced since) and names nothing. The file::

    header  magic b"LXDROPS\\0" | u32 version (1) | u32 n | n bytes: the
            generation id of the array directory | u32 CRC32 of the above
    record  u32 kind | u32 payload bytes | u64 base rows | payload |
            u32 CRC32 of kind..payload, seeded with the previous CRC
            (the header's for the first record)

All integers little-endian. ``base rows`` is the array's row count when the
record was written (every row it names is below it). Kind 1: the dropped
rows as runs, u64 pairs ``start, stop`` (ascending, disjoint); kind 2: a
bitmap, u64 ``first`` and then bit i (little-endian bit order) set for base
row ``first + i``. A drop writes the smaller of the two.

The CRC chain makes a torn tail harmless: replay stops at the first record
that is short or fails its CRC, and the next drop writes over it; bytes
left behind it cannot pass the chain (it is seeded by the new record). A
durable drop is one ``pwrite`` and one fsync (the first drop of an array
also fsyncs the root, for the log's name, after sealing the store's marker
at version 3 so that an older loaderx refuses the store rather than read
dropped rows); with ``durable=False`` the fsyncs wait for ``sync()``. A
record may only name rows the store keeps through a power cut: an array
with appends since its last sync is synced first.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
import numpy.typing as npt

from ._fs import OsFs, parent_of
from .zrecord import CorruptStoreError

DELETES_PREFIX = ".deletes-"
MAGIC = b"LXDROPS\x00"
LOG_VERSION = 1
HEAD = struct.Struct("<8sII")  # magic, version, generation bytes
RECORD = struct.Struct("<IIQ")  # kind, payload bytes, base rows
CRC = struct.Struct("<I")
U64 = struct.Struct("<Q")
RUNS, BITMAP = 1, 2
GENERATION_BYTES_MAX = 256
LOG_BYTES_MAX = 1 << 40  # read whole: a log is compacted away long before this


def log_path(array_path: str) -> str:
    """``<root>/.deletes-<name>`` of the array directory ``<root>/<name>``,
    as ``os.path.join(root, DELETES_PREFIX + name)`` spells it (a lazy load
    looks for it on every open)."""
    root, separator, name = array_path.rpartition("/")  # POSIX paths: loaderx runs on Linux
    return f"{root}{separator}{DELETES_PREFIX}{name}"


def header(generation: str | None) -> bytes:
    identity = (generation or "").encode()
    head = HEAD.pack(MAGIC, LOG_VERSION, len(identity)) + identity
    return head + CRC.pack(zlib.crc32(head))


def read_header(payload: bytes, path: str) -> tuple[str | None, int, int] | None:
    """(generation, header bytes, CRC) of a log, or None when its header is
    torn (a first drop cut short: it holds no acknowledged record)."""
    if len(payload) < HEAD.size + CRC.size:
        return None
    magic, version, count = HEAD.unpack_from(payload)
    end = HEAD.size + count
    if magic != MAGIC or count > GENERATION_BYTES_MAX or len(payload) < end + CRC.size:
        return None
    crc = zlib.crc32(payload[:end])
    if CRC.unpack_from(payload, end)[0] != crc:
        return None
    if version != LOG_VERSION:
        raise CorruptStoreError(
            f"delete log '{path}' has version {version}, newer than this loaderx reads "
            f"({LOG_VERSION}): upgrade loaderx"
        )
    return payload[HEAD.size : end].decode(errors="replace") or None, end + CRC.size, crc


def encode(base: npt.NDArray[np.uint64]) -> tuple[int, bytes]:
    """The record payload (kind, bytes) of the sorted, unique base rows ``base``."""
    rows = base.view(np.int64)  # below 2**63: int64 indexes faster than uint64
    mask = np.zeros(int(rows[-1]) + 1, dtype=bool)
    mask[rows] = True
    return encode_mask(mask, rows.size)


def encode_mask(mask: npt.NDArray[np.bool_], count: int) -> tuple[int, bytes]:
    """The record payload (kind, bytes) of the ``count`` base rows set in
    ``mask`` (a bitmap from base row 0): runs or a bitmap, the smaller.
    Every temporary is at most a byte per row of the span: fresh memory is
    what a drop of many rows spends its time on (page faults). The runs are
    counted on the packed bitmap (a bit per row), which the bitmap record
    writes as it is."""
    first = int(np.argmax(mask))  # a bool argmax stops at the first set row
    last = _last_set(mask)
    inside = mask[first : last + 1]
    bitmap_bytes = U64.size + (inside.size + 7) // 8
    packed = np.packbits(inside, bitorder="little")
    runs = _run_count(packed, inside)
    if runs * 16 <= bitmap_bytes:
        steps = np.diff(inside.view(np.int8))  # 1 where a run starts, -1 past its end
        starts = np.concatenate(([0], np.flatnonzero(steps == 1) + 1)) + first
        stops = np.concatenate((np.flatnonzero(steps == -1) + 1, [inside.size])) + first
        pairs = np.stack([starts, stops], axis=1)
        return RUNS, pairs.astype("<u8").tobytes()
    return BITMAP, U64.pack(first) + packed.tobytes()


_TAIL_ROWS = 1 << 16  # the last set row is looked for this many rows at a time
_POPCOUNT = getattr(np, "bitwise_count", None)  # NumPy 2.0 and later


def _last_set(mask: npt.NDArray[np.bool_]) -> int:
    """The last set row of ``mask`` (one is set): a reversed argmax is slow
    (NumPy's fast bool path needs a forward stride), so the tail is scanned
    a block at a time and only the block holding it reversed."""
    end = mask.size
    while end > 0:
        start = max(0, end - _TAIL_ROWS)
        block = mask[start:end]
        if block.any():
            return start + block.size - 1 - int(np.argmax(block[::-1]))
        end = start
    raise ValueError("no row is set")  # the callers' masks name at least one row


def _run_count(packed: npt.NDArray[np.uint8], inside: npt.NDArray[np.bool_]) -> int:
    """The runs of set bits in ``inside`` (which starts with one), counted
    as run starts (a set bit after a clear one) on its little-endian packed
    bits ``packed``, 64 at a time."""
    if _POPCOUNT is None:  # NumPy 1.x: one comparison per row
        return int(np.count_nonzero(inside[1:] > inside[:-1])) + 1
    words = np.zeros(-(-packed.size // 8), dtype="<u8")
    words.view(np.uint8)[: packed.size] = packed
    before = np.empty_like(words)  # each bit's predecessor: the word shifted up a bit...
    np.left_shift(words, np.uint64(1), out=before)
    before[1:] |= words[:-1] >> np.uint64(63)  # ...and the previous word's top bit
    starts = np.bitwise_and(words, np.invert(before, out=before), out=before)
    return int(_POPCOUNT(starts).sum(dtype=np.int64))


def decode(kind: int, payload: bytes, rows: int) -> npt.NDArray[np.int64] | None:
    """The base rows a record names, or None when they are not a record's
    (rows at or past ``rows``, runs out of order)."""
    if kind == RUNS and len(payload) % 16 == 0 and payload:
        pairs = np.frombuffer(payload, dtype="<u8").reshape(-1, 2).astype(np.int64)
        starts, stops = pairs[:, 0], pairs[:, 1]
        if np.any(starts < 0) or np.any(stops <= starts) or np.any(starts[1:] < stops[:-1]):
            return None
        if int(stops[-1]) > rows:
            return None
        lengths = stops - starts
        offsets = np.repeat(np.cumsum(lengths) - lengths - starts, lengths)
        base: npt.NDArray[np.int64] = np.arange(int(lengths.sum()), dtype=np.int64) - offsets
        return base
    if kind == BITMAP and len(payload) > U64.size:
        first = U64.unpack_from(payload)[0]
        bits = np.unpackbits(np.frombuffer(payload, np.uint8, offset=U64.size), bitorder="little")
        found = np.flatnonzero(bits).astype(np.int64) + np.int64(first)
        if found.size == 0 or first >= rows or int(found[-1]) >= rows:
            return None
        return found
    return None


class TakeBackFailed(Exception):
    """Writing a record failed (``cause``) and so did overwriting it with
    zeros (``second``): whether the drop took effect is unknown."""

    def __init__(self, cause: OSError, second: OSError) -> None:
        super().__init__(str(cause))
        self.cause = cause
        self.second = second


class DeleteLog:
    """The delete log of one open array: where the next record goes
    (``end``, ``crc``) and what is not durable yet."""

    def __init__(self, path: str, fs: OsFs, generation: str | None, durable: bool) -> None:
        self.path = path
        self.fs = fs
        self.generation = generation
        self.durable = durable
        self.end = 0  # bytes of the valid prefix: the next record is written there
        self.crc = 0  # the chain's value at ``end`` (meaningless while end == 0)
        self.size: int | None = None  # the file's size when last read; None: no file
        self.unsynced = False  # records written since the last fsync (durable=False)
        self.new_name = False  # the file's entry in the root is not durable yet

    def replay(self, rows: int) -> list[npt.NDArray[np.int64]]:
        """Reads the log: the base rows each valid record drops (none for a
        missing, torn or stale log). ``rows``: the array's base rows now."""
        self.end, self.crc, self.size = 0, 0, None
        try:
            payload = self.fs.read_file(self.path, LOG_BYTES_MAX)
        except FileNotFoundError:
            return []
        self.size = len(payload)
        head = read_header(payload, self.path)
        if head is None or head[0] != self.generation:
            return []  # torn (nothing acknowledged) or stale (another directory's)
        _, offset, crc = head
        dropped = []
        while offset + RECORD.size + CRC.size <= len(payload):
            kind, count, base_rows = RECORD.unpack_from(payload, offset)
            end = offset + RECORD.size + count
            if count > len(payload) or end + CRC.size > len(payload):
                break
            chained = zlib.crc32(memoryview(payload)[offset:end], crc)
            if CRC.unpack_from(payload, end)[0] != chained:
                break  # torn or never completed: the log ends here
            record = payload[offset + RECORD.size : end]
            base = None if base_rows > rows else decode(kind, record, base_rows)
            if base is None:
                raise CorruptStoreError(
                    f"delete log '{self.path}' has a record (at byte {offset}) that passes its "
                    f"checksum but names rows the array does not have ({rows} rows): the log or "
                    "the array is damaged; restore the ArrayStore from a backup"
                )
            dropped.append(base)
            offset, crc = end + CRC.size, chained
        self.end, self.crc = offset, crc
        return dropped

    def append(self, mask: npt.NDArray[np.bool_], count: int, rows: int) -> None:
        """Writes the record of dropping the ``count`` base rows set in
        ``mask`` (``rows``: the array's base rows), durable when it returns unless
        ``durable=False``. On a file-system error the record is taken back
        (overwritten with zeros, which no CRC passes) and the error raised;
        TakeBackFailed when taking it back failed too."""
        kind, payload = encode_mask(mask, count)
        record = RECORD.pack(kind, len(payload), rows)
        first = self.end == 0
        head = header(self.generation) if first else b""
        seed = CRC.unpack_from(head, len(head) - CRC.size)[0] if first else self.crc
        crc = zlib.crc32(payload, zlib.crc32(record, seed))
        data = b"".join((head, record, payload, CRC.pack(crc)))  # one copy of the payload
        fs = self.fs
        try:
            fs.write_at(self.path, self.end, data)
            if self.durable:
                fs.fsync_file(self.path)
                if first:
                    fs.fsync_dir(parent_of(self.path))
        except OSError as exc:
            try:
                fs.write_at(self.path, self.end, bytes(len(data)))
                fs.fsync_file(self.path)  # durable=False too: the call says it changed nothing
            except OSError as second:
                raise TakeBackFailed(exc, second) from exc
            raise
        self.end += len(data)
        self.crc = crc
        self.size = max(self.size or 0, self.end)
        if not self.durable:
            self.unsynced = True
            self.new_name = self.new_name or first

    def sync(self) -> None:
        """Makes the records written with ``durable=False`` durable."""
        if self.unsynced:
            self.fs.fsync_file(self.path)
            self.unsynced = False
        if self.new_name:
            self.fs.fsync_dir(parent_of(self.path))
            self.new_name = False


def kept_rows(rows: int, dropped: list[npt.NDArray[np.int64]]) -> npt.NDArray[np.bool_] | None:
    """The mask of the ``rows`` base rows not in ``dropped`` (True: kept);
    None when nothing is dropped."""
    if not dropped:
        return None
    keep = np.ones(rows, dtype=bool)
    for base in dropped:
        keep[base] = False
    return keep
