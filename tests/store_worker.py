"""The child-process side of tests/test_crash.py and tests/test_corruption.py,
and the pieces both share: a seeded op sequence with its in-memory model, and
a reader/writer of the superblock (format in zig/format.zig).

Run as a script (each mode prints lines the parent reads on stdout):

  store_worker.py crash PATH SEED     runs ops(SEED) on PATH; "B j" before op j, "A j" after
  store_worker.py hold PATH           takes the writer lock, prints "locked", waits for stdin EOF
  store_worker.py appender PATH SEED  appends appender_batches(SEED), printing "A j" after each
  store_worker.py recover PATH SEED ACKED
                                      after a crash: reads PATH, recovers it as a writer,
                                      prints a JSON report
  store_worker.py check PATH SPEC     opens a (damaged) store, reads every record, prints a
                                      JSON report
"""

from __future__ import annotations

import hashlib
import json
import random
import struct
import sys

import numpy as np

# ---- the op sequence and its model -------------------------------------------

FIXED_LENGTHS = (0, 1, 8, 100, 4096, 20000, 70000)


def record(seed: int, op: int, k: int, length: int, compressible: bool) -> bytes:
    """Record k of op `op`: a pure function of its arguments."""
    rng = np.random.default_rng([seed, op, k])
    return rng.integers(0, 4 if compressible else 256, length, dtype=np.uint8).tobytes()


def variable_length(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.10:
        return 0
    if roll < 0.40:
        return rng.randint(1, 64)
    if roll < 0.80:
        return rng.randint(65, 3000)
    if roll < 0.94:
        return rng.randint(3001, 20000)
    return rng.randint(65 * 1024, 90 * 1024)


def model_delete(records: list, indices, keep_order: bool) -> list:
    """Delete semantics: keep_order removes; otherwise the tail fills each hole."""
    doomed = sorted(set(indices))
    if keep_order:
        gone = set(doomed)
        return [r for i, r in enumerate(records) if i not in gone]
    n = len(records)
    remaining = n - len(doomed)
    gone = set(doomed)
    holes = [d for d in doomed if d < remaining]
    sources = [i for i in range(remaining, n) if i not in gone]
    out = records[:remaining]
    for hole, source in zip(holes, sources):
        out[hole] = records[source]
    return out


VARIANTS = ("mixed", "fixed", "mixed-lazy", "fixed-lazy")


def make_ops(
    seed: int, op_count: int = 14, variant: str = "mixed"
) -> tuple[list[dict], list[list[bytes]]]:
    """A deterministic op sequence and states[j], the records after j ops.
    A "fixed" variant keeps the store fixed (equal-length raw records), so
    its replaces go through the journal in place; "-lazy" ones open the
    store with durable=False."""
    rng = random.Random(seed)
    fixed = rng.choice(FIXED_LENGTHS)
    if variant.startswith("fixed"):
        fixed = rng.choice(FIXED_LENGTHS[1:])
        op_count = 20
    ops: list[dict] = []
    states: list[list[bytes]] = [[]]
    records: list[bytes] = []
    for j in range(op_count):
        n = len(records)
        op = op_fields(rng, op_kind(rng, j, n, variant), n, fixed)
        ops.append(op)
        records = model_op(records, seed, j, op)
        states.append(records)
    return ops, states


def op_kind(rng: random.Random, j: int, n: int, variant: str) -> str:
    """The kind of op j on a store of n records (the draws make_ops' sequence depends on)."""
    if j == 0:
        return "append_fixed" if rng.random() < 0.6 else "append_var"
    if n == 0:
        return rng.choice(["append_fixed", "append_var"])
    if variant.startswith("fixed"):
        return rng.choices(["append_fixed", "replace_fixed", "delete", "sync"], [20, 60, 10, 10])[0]
    return rng.choices(
        ["append_fixed", "append_var", "replace", "delete", "compact", "sync"],
        [25, 15, 20, 22, 13, 5],
    )[0]


def op_fields(rng: random.Random, kind: str, n: int, fixed: int) -> dict:
    """An op of `kind` on a store of n records, its lengths, indices and codec drawn from rng."""
    op: dict = {"kind": kind}
    if kind == "append_fixed":
        op.update(
            kind="append", codec="raw", compressible=False, lengths=[fixed] * rng.randint(1, 24)
        )
    elif kind == "append_var":
        op.update(
            kind="append",
            codec=rng.choice(["zstd", "zstd", "raw"]),
            compressible=rng.random() < 0.8,
            lengths=[variable_length(rng) for _ in range(rng.randint(1, 8))],
        )
    elif kind == "replace_fixed":
        idxs = rng.sample(range(n), rng.randint(1, min(n, 40)))
        op.update(
            kind="replace",
            codec="raw",
            compressible=False,
            lengths=[fixed] * len(idxs),
            idxs=idxs,
        )
    elif kind == "replace":
        idxs = rng.sample(range(n), rng.randint(1, min(n, 6)))
        if rng.random() < 0.5:
            op.update(codec="raw", compressible=False, lengths=[fixed] * len(idxs))
        else:
            op.update(
                codec="zstd",
                compressible=rng.random() < 0.8,
                lengths=[variable_length(rng) for _ in idxs],
            )
        op["idxs"] = idxs
    elif kind == "delete":
        count = rng.randint(1, max(1, min(n, n // 3 + 1)))
        op.update(idxs=[rng.randrange(n) for _ in range(count)], keep_order=rng.random() < 0.5)
    return op


def model_op(records: list[bytes], seed: int, j: int, op: dict) -> list[bytes]:
    """The records after op j (a new list: the states before it stay as they were)."""
    if "lengths" in op:
        fresh = payloads(seed, j, op)
        if op["kind"] == "replace":
            records = list(records)
            for index, contents in zip(op["idxs"], fresh):
                records[index] = contents
            return records
        return records + fresh
    if op["kind"] == "delete":
        return model_delete(records, op["idxs"], op["keep_order"])
    return records


def payloads(seed: int, j: int, op: dict) -> list[bytes]:
    return [
        record(seed, j, k, length, op["compressible"]) for k, length in enumerate(op["lengths"])
    ]


def pack(records: list[bytes]) -> tuple[bytes, np.ndarray]:
    """Records back to back and the start of each, as append/replace take them."""
    starts = np.zeros(len(records), dtype=np.uint64)
    if records:
        starts[1:] = np.cumsum([len(r) for r in records[:-1]], dtype=np.uint64)
    return b"".join(records), starts


def apply_op(store, seed: int, j: int, op: dict, fresh: list[bytes] | None) -> None:
    kind = op["kind"]
    if kind == "append":
        src, starts = pack(fresh)
        store.append(src, starts, codec=op["codec"])
    elif kind == "replace":
        src, starts = pack(fresh)
        store.replace(op["idxs"], src, starts, codec=op["codec"])
    elif kind == "delete":
        store.delete(op["idxs"], keep_order=op["keep_order"])
    elif kind == "compact":
        store.compact()
    elif kind == "sync":
        store.sync()
    else:  # pragma: no cover
        raise AssertionError(kind)


def appender_batch(seed: int, j: int) -> list[bytes]:
    """Batch j of the concurrent-reader test: equal-length raw records first
    (fixed layout), then variable ones (the store turns indexed mid-run)."""
    rng = random.Random(seed * 1000 + j)
    count = rng.randint(1, 12)
    if j < 20:
        return [record(seed, j, k, 300, False) for k in range(count)]
    return [record(seed, j, k, variable_length(rng), True) for k in range(count)]


# ---- the superblock ------------------------------------------------------------

SLOT_BYTES = 4096
SUPERBLOCK_BYTES = 256
SUPERBLOCK_SEED = 0x5355_5045_5242_4C4B
FIELDS = (
    "version",
    "layout",
    "generation",
    "record_count",
    "record_bytes",
    "data_file",
    "data_bytes",
    "index_file",
    "sums_file",
    "tail_checksum",
    "live_bytes",
    "dict_file",
    "dict_bytes",
    "dict_checksum",
)
HEAD = struct.Struct("<8sII12Q")  # magic, version, layout, generation .. dict_checksum
FIELD_OFFSETS = {"magic": 0, "version": 8, "layout": 12}
FIELD_OFFSETS.update({name: 16 + 8 * i for i, name in enumerate(FIELDS[2:])})
MAGIC = b"ZRECORD\x00"


# The fields at the end of the superblock, before its checksum.
TAIL_FIELDS = ("journal_file", "journal_sequence", "unsynced", "synced_base")
TAIL = struct.Struct("<4Q")
TAIL_OFFSET = SUPERBLOCK_BYTES - 8 - TAIL.size
FIELD_OFFSETS.update({name: TAIL_OFFSET + 8 * i for i, name in enumerate(TAIL_FIELDS)})
JOURNAL_PAGE_BYTES = 4096


def parse_slot(raw: bytes) -> dict:
    """One slot's fields, and whether its checksum holds."""
    values = HEAD.unpack_from(raw, 0)
    slot = {"magic": values[0]}
    slot.update(zip(FIELDS, values[1:]))
    slot.update(zip(TAIL_FIELDS, TAIL.unpack_from(raw, TAIL_OFFSET)))
    slot["checksum"] = struct.unpack_from("<Q", raw, SUPERBLOCK_BYTES - 8)[0]
    slot["sealed"] = slot["checksum"] == xxh3_64_long(raw[: SUPERBLOCK_BYTES - 8], SUPERBLOCK_SEED)
    return slot


def seal(raw: bytes) -> bytes:
    """The 256 bytes of a slot with its checksum recomputed."""
    body = bytes(raw[: SUPERBLOCK_BYTES - 8])
    return body + struct.pack("<Q", xxh3_64_long(body, SUPERBLOCK_SEED))


def read_slots(path) -> list[dict]:
    with open(f"{path}/superblock", "rb") as f:
        raw = f.read(2 * SLOT_BYTES)
    return [
        parse_slot(raw[i * SLOT_BYTES :][:SUPERBLOCK_BYTES])
        for i in range(2)
        if len(raw) >= i * SLOT_BYTES + SUPERBLOCK_BYTES
    ]


def committed_superblock(path) -> dict:
    """The slot a reader uses: the newest sound one."""
    sound = [
        s for s in read_slots(path) if s["magic"] == MAGIC and s["sealed"] and s["version"] == 1
    ]
    assert sound, f"no sound superblock slot in {path}"
    return max(sound, key=lambda s: s["generation"])


def named_files(superblock: dict) -> dict[str, int]:
    """The store files a superblock names, with the bytes it commits in each."""
    files = {}
    if superblock["data_file"]:
        files[f"data-{superblock['data_file']:016x}"] = superblock["data_bytes"]
    if superblock["index_file"]:
        files[f"index-{superblock['index_file']:016x}"] = superblock["record_count"] * 32
    if superblock["sums_file"]:
        files[f"sums-{superblock['sums_file']:016x}"] = superblock["data_bytes"] // (16 * 1024) * 8
    if superblock["dict_file"]:
        files[f"dict-{superblock['dict_file']:016x}"] = superblock["dict_bytes"]
    if superblock["journal_file"]:
        # A checkpointed journal is its page alone (records follow it).
        files[f"journal-{superblock['journal_file']:016x}"] = JOURNAL_PAGE_BYTES
    return files


# XXH3-64 with a seed, long-input path (> 240 bytes) only: the superblock
# checksum covers 248 bytes. Checked against the checksums the store writes.
_M = (1 << 64) - 1
_SECRET = bytes.fromhex(
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e"
)
_P32_1, _P32_2, _P32_3 = 0x9E3779B1, 0x85EBCA77, 0xC2B2AE3D
_P64 = (
    0x9E3779B185EBCA87,
    0xC2B2AE3D27D4EB4F,
    0x165667B19E3779F9,
    0x85EBCA77C2B2AE63,
    0x27D4EB2F165667C5,
)


def xxh3_64_long(data: bytes, seed: int) -> int:
    assert len(data) > 240
    words = struct.unpack("<24Q", _SECRET)
    secret = struct.pack(
        "<24Q", *[(w + seed if i % 2 == 0 else w - seed) & _M for i, w in enumerate(words)]
    )
    r64 = lambda buffer, offset: struct.unpack_from("<Q", buffer, offset)[0]  # noqa: E731
    acc = [_P32_3, _P64[0], _P64[1], _P64[2], _P64[3], _P32_2, _P64[4], _P32_1]

    def accumulate(offset: int, secret_offset: int) -> None:
        for i in range(8):
            value = r64(data, offset + 8 * i)
            key = value ^ r64(secret, secret_offset + 8 * i)
            acc[i ^ 1] = (acc[i ^ 1] + value) & _M
            acc[i] = (acc[i] + (key & 0xFFFFFFFF) * (key >> 32)) & _M

    stripes_per_block = (len(secret) - 64) // 8
    block_bytes = 64 * stripes_per_block
    blocks = (len(data) - 1) // block_bytes
    for b in range(blocks):
        for s in range(stripes_per_block):
            accumulate(b * block_bytes + s * 64, s * 8)
        for i in range(8):
            a = acc[i] ^ (acc[i] >> 47) ^ r64(secret, len(secret) - 64 + 8 * i)
            acc[i] = (a * _P32_1) & _M
    for s in range(((len(data) - 1) - block_bytes * blocks) // 64):
        accumulate(blocks * block_bytes + s * 64, s * 8)
    accumulate(len(data) - 64, len(secret) - 64 - 7)
    result = (len(data) * _P64[0]) & _M
    for i in range(4):
        product = (acc[2 * i] ^ r64(secret, 11 + 16 * i)) * (
            acc[2 * i + 1] ^ r64(secret, 19 + 16 * i)
        )
        result = (result + ((product ^ (product >> 64)) & _M)) & _M
    result ^= result >> 37
    result = (result * 0x165667919E3779F9) & _M
    return result ^ (result >> 32)


# ---- the child modes -------------------------------------------------------------


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def run_crash(path: str, seed: int, variant: str = "mixed") -> None:
    from loaderx.zrecord import Zrecord

    ops, _ = make_ops(seed, variant=variant)
    store = Zrecord(path, codec="zstd", durable=not variant.endswith("lazy"))
    for j, op in enumerate(ops):
        fresh = payloads(seed, j, op) if "lengths" in op else None
        say(f"B {j}")
        apply_op(store, seed, j, op, fresh)
        say(f"A {j}")
    store.close()
    say("DONE")


def run_hold(path: str) -> None:
    from loaderx.zrecord import Zrecord

    store = Zrecord(path)
    store.append(b"held", [0])
    say("locked")
    sys.stdin.read()
    store.close()


def run_appender(path: str, seed: int, batches: int) -> None:
    from loaderx.zrecord import Zrecord

    store = Zrecord(path, codec="zstd")
    for j in range(batches):
        src, starts = pack(appender_batch(seed, j))
        store.append(src, starts, codec="raw" if j < 20 else "zstd")
        say(f"A {j}")
    store.close()
    say("DONE")


def read_all(store) -> list[bytes]:
    """Every record of the store, read in one gather."""
    n = len(store)
    if n == 0:
        return []
    lengths = [int(x) for x in store.lengths(np.arange(n))]
    offsets = np.cumsum([0] + lengths[:-1], dtype=np.uint64)
    buffer = bytearray(sum(lengths))
    store.gather(np.arange(n), buffer, offsets)
    return [bytes(buffer[int(o) : int(o) + length]) for o, length in zip(offsets, lengths)]


def describe(records: list[bytes]) -> str:
    return f"{len(records)} records, lengths {[len(r) for r in records][:16]}"


def interval_start(done: list[dict]) -> int:
    """How many of the ops `done` come before the first replace that no other
    commit followed: where a killed durable=False writer's store opens at the
    oldest (every commit after an in-place replace is durable)."""
    start = None
    for j, op in enumerate(done):
        if op["kind"] == "replace":
            start = j if start is None else start
        elif op["kind"] != "compact":
            start = None
    return len(done) if start is None else start


def run_recover(path: str, seed: int, acked: int, variant: str = "mixed") -> None:
    """The checks after a crash, in a fresh process so a crash here is caught.

    A reader must see state `acked` (the last acknowledged op) or `acked + 1`
    (the op in flight, applied whole), or with durable=False the state before
    the in-place replaces since the last durable commit; then a writer recovers the store: it
    takes a new record, and the directory holds exactly the files the
    committed superblock names, at exactly their committed lengths.
    """
    import os

    from loaderx.zrecord import Zrecord

    ops, states = make_ops(seed, variant=variant)
    report: dict = {}
    with Zrecord(path, verify=True) as store:
        found = read_all(store)
        report["verify"] = store.verify()
    candidates = (acked, acked + 1)
    if variant.endswith("lazy"):
        # durable=False: in-place replaces since the last durable commit
        # are undone by the undo area (docs/concepts/journal.md).
        candidates = (interval_start(ops[:acked]),) + candidates
    matches = [j for j in candidates if j < len(states) and states[j] == found]
    report["match"] = max(matches) if matches else None
    if not matches:
        report["found"] = describe(found)
        report["expected"] = [describe(states[j]) for j in (acked, acked + 1) if j < len(states)]
        say(json.dumps(report))
        return
    state = states[report["match"]]
    extra = record(seed, 999, 0, random.Random(seed).choice([0, 5, 300, 70000]), True)
    with Zrecord(path, codec="zstd") as store:
        report["first"] = store.append(extra, [0])
        report["after_append_ok"] = read_all(store) == state + [extra]
        report["named"] = named_files(committed_superblock(path))
        report["on_disk"] = {
            name: os.path.getsize(f"{path}/{name}")
            for name in os.listdir(path)
            if name not in ("superblock", "lock")
        }
        report["verify_after"] = store.verify()
    with Zrecord(path, verify=True) as store:
        report["reopen_ok"] = read_all(store) == state + [extra]
    report["expected_first"] = len(state)
    say(json.dumps(report))


def digest(data) -> str:
    return hashlib.blake2b(bytes(data), digest_size=8).hexdigest()


def run_check(path: str, spec_path: str) -> None:
    """Opens a damaged store and reads everything; reports each outcome.

    Outcomes: a digest of the bytes read, "E:<class>" for a ZrecordError, or
    "X:<class>: message" for any other exception (a failure for the parent).
    The destination buffers are sized from the expected lengths, not from the
    store, so a damaged length cannot make this script allocate wildly.
    """
    import resource

    resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    from loaderx.zrecord import Zrecord, ZrecordError

    with open(spec_path) as f:
        spec = json.load(f)
    room = spec["room"]  # room[i]: the most bytes record i has in any accepted state
    read_limit = spec["read_limit"]
    report: dict = {}

    def outcome(call):
        try:
            return call()
        except ZrecordError as exc:
            return f"E:{type(exc).__name__}"
        except Exception as exc:  # noqa: BLE001 - reported, the parent fails on it
            return f"X:{type(exc).__name__}: {exc}"[:300]

    def open_store(verify):
        try:
            return Zrecord(path, verify=verify)
        except ZrecordError as exc:
            report[f"open_{verify}"] = f"E:{type(exc).__name__}: {exc}"[:400]
        except Exception as exc:  # noqa: BLE001
            report[f"open_{verify}"] = f"X:{type(exc).__name__}: {exc}"[:400]
        return None

    store = open_store(True)
    if store is not None:
        report["open_True"] = "ok"
        check_verified(store, room, read_limit, outcome, report)
        store.close()
    # Without verify: wrong bytes may come back, but never a crash.
    plain = open_store(False)
    if plain is not None:
        report["open_False"] = "ok"
        count = min(len(plain), read_limit, len(room))
        idxs = list(range(count))
        offsets = np.cumsum([0] + [room[i] for i in idxs[:-1]], dtype=np.uint64)
        buffer = bytearray(sum(room[i] for i in idxs) + 1)
        report["plain_gather"] = outcome(
            lambda: plain.gather(idxs, buffer, offsets) if idxs else None
        )
        plain.close()
    report["maxrss_kib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    say(json.dumps(report))


def check_verified(store, room: list[int], read_limit: int, outcome, report: dict) -> None:
    """run_check's reads through a store opened with verify=True: each record alone, shuffled
    batches of 7 gathered into buffers sized from `room`, then verify(); each into `report`."""
    n = len(store)
    report["n"] = n
    report["generation"] = store.stats()["generation"]
    count = min(n, read_limit, len(room))
    report["single"] = [outcome(lambda i=i: digest(store.read(i))) for i in range(count)]
    batches = []
    rng = random.Random(n)
    order = list(range(count))
    rng.shuffle(order)
    for start in range(0, count, 7):
        idxs = order[start : start + 7]
        offsets = np.cumsum([0] + [room[i] for i in idxs[:-1]], dtype=np.uint64)
        buffer = bytearray(sum(room[i] for i in idxs))

        def batch(idxs=idxs, offsets=offsets, buffer=buffer):
            lengths = [int(x) for x in store.lengths(idxs)]
            store.gather(idxs, buffer, offsets)
            return [digest(buffer[int(o) : int(o) + length]) for o, length in zip(offsets, lengths)]

        batches.append([idxs, outcome(batch)])
    report["batches"] = batches
    verified = outcome(store.verify)
    report["verify"] = verified


def main(argv: list[str]) -> None:
    mode, path = argv[1], argv[2]
    if mode == "crash":
        run_crash(path, int(argv[3]), *argv[4:5])
    elif mode == "hold":
        run_hold(path)
    elif mode == "appender":
        run_appender(path, int(argv[3]), int(argv[4]))
    elif mode == "recover":
        run_recover(path, int(argv[3]), int(argv[4]), *argv[5:6])
    elif mode == "check":
        run_check(path, argv[3])
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)
