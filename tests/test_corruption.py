"""Damaged and hostile stores: flipped bits and bytes, zeroed pages,
truncations, deleted and extended files in every file of a store, each
opened and read in its own subprocess. The outcome must be the right bytes or
a ZrecordError: never a signal, a hang, another exception, a wild allocation
or wrong data. Plus the named cases: wrong magic, a newer format version, a
truncated or missing data file, a torn newest superblock slot.

LOADERX_CASES raises the number of random cases (soak runs); LOADERX_SEED
fixes the seed. A failing case keeps its damaged store under pytest's
tmp_path and names it in the failure message.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import struct
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import store_worker as worker

from loaderx.zrecord import ChecksumError, CorruptStoreError, Zrecord

WORKER = str(Path(__file__).with_name("store_worker.py"))
CASES = int(os.environ.get("LOADERX_CASES", "210"))
HOSTILE_CASES = max(30, CASES // 6)
SOAK_CASES = int(os.environ.get("LOADERX_CASES", "3000"))
BASE_SEED = int(os.environ.get("LOADERX_SEED", random.randrange(1 << 30)))
CASE_TIMEOUT_S = 60
RSS_LIMIT_KIB = 1 << 20  # 1 GiB: the stores hold a few hundred KiB

# ---- reference stores: built by known ops, every generation's contents kept ----


def contents(store: Zrecord) -> list[bytes]:
    return [store.read(i) for i in range(len(store))]


class Reference:
    """A store built by a known sequence of ops; `states[g]` is the records a
    reader must see at generation g."""

    def __init__(self, path: Path):
        self.path = path
        self.states: dict[int, list[bytes]] = {0: []}
        self.store = Zrecord(path, codec="zstd")

    def step(self, call) -> None:
        before = max(self.states)
        call(self.store)
        generation = self.store.stats()["generation"]
        # A conversion to the indexed layout commits a generation of its own
        # that holds the records as they were.
        for g in range(before + 1, generation):
            self.states[g] = self.states[before]
        self.states[generation] = contents(self.store)

    def finish(self) -> Reference:
        self.store.close()
        self.store = None
        final = max(self.states)
        # A reader sees the newest sound slot: the last commit or, if its slot
        # is damaged, the one before.
        self.accepted = {g: self.states[g] for g in (final, final - 1) if g in self.states}
        self.files = sorted(os.listdir(self.path))
        return self


def rand_records(rng: np.random.Generator, lengths, compressible=True) -> tuple[bytes, np.ndarray]:
    records = [
        rng.integers(0, 4 if compressible else 256, n, dtype=np.uint8).tobytes() for n in lengths
    ]
    return worker.pack(records)


def variable_lengths(rng: random.Random, count: int) -> list[int]:
    return [worker.variable_length(rng) for _ in range(count)]


def build_fixed(path: Path) -> Reference:
    ref, rng = Reference(path), np.random.default_rng(1)
    for count in (150, 100, 60):  # 62000 bytes: three full 16 KiB blocks and a tail
        ref.step(lambda s, c=count: s.append(*rand_records(rng, [200] * c, False), codec="raw"))
    return ref.finish()


def build_indexed(path: Path) -> Reference:
    ref, rng, lengths = Reference(path), np.random.default_rng(2), random.Random(2)
    for count in (30, 20, 10):
        ref.step(
            lambda s, c=count: s.append(
                *rand_records(rng, [0, 70000] + variable_lengths(lengths, c))
            )
        )
    ref.step(lambda s: s.append(*rand_records(rng, variable_lengths(lengths, 8), False)))
    # Byte-shuffled records (odd lengths included) beside the plain ones.
    ref.step(
        lambda s: s.append(
            *rand_records(rng, [3, 70001] + variable_lengths(lengths, 10)), codec="zstd_shuffle4"
        )
    )
    return ref.finish()


def build_dictionary(path: Path) -> Reference:
    ref, rng = Reference(path), random.Random(3)
    words = [
        b"alpha",
        b"beta",
        b"gamma",
        b"delta",
        b"label",
        b"image",
        b"width",
        b"height",
        b"{",
        b"}",
        b":",
        b",",
    ]

    def text(n):
        return b" ".join(rng.choice(words) + str(rng.randrange(1000)).encode() for _ in range(n))

    samples = [text(rng.randint(20, 60)) for _ in range(400)]
    ref.step(lambda s: s.train_dict(b"".join(samples), [len(x) for x in samples], 2048))
    for count in (40, 25):
        records = [text(rng.randint(0, 80)) for _ in range(count)]
        ref.step(lambda s, r=records: s.append(*worker.pack(r), codec="zstd_dict"))
    records = [text(rng.randint(0, 80)) for _ in range(20)]
    ref.step(lambda s: s.append(*worker.pack(records), codec="zstd_dict_shuffle2"))
    return ref.finish()


def build_garbage(path: Path) -> Reference:
    """Indexed, with replaced and deleted records still in the data file."""
    ref, rng, lengths = Reference(path), np.random.default_rng(4), random.Random(4)
    ref.step(lambda s: s.append(*rand_records(rng, variable_lengths(lengths, 40))))
    ref.step(
        lambda s: s.replace([3, 17, 0, 39, 20], *rand_records(rng, variable_lengths(lengths, 5)))
    )
    ref.step(
        lambda s: s.replace(
            [8, 9], *rand_records(rng, variable_lengths(lengths, 2)), codec="zstd_shuffle8"
        )
    )
    ref.step(lambda s: s.delete([5, 6, 7, 30], keep_order=True))
    ref.step(lambda s: s.delete([0, 2, 33, 35, 35], keep_order=False))
    ref.step(lambda s: s.append(*rand_records(rng, variable_lengths(lengths, 10))))
    return ref.finish()


def build_converted(path: Path) -> Reference:
    """Fixed, rewritten by replace and delete, turned indexed, then compacted."""
    ref, rng, lengths = Reference(path), np.random.default_rng(5), random.Random(5)
    ref.step(lambda s: s.append(*rand_records(rng, [100] * 300, False), codec="raw"))
    ref.step(lambda s: s.replace([1, 250], *rand_records(rng, [100, 100], False), codec="raw"))
    ref.step(lambda s: s.delete(list(range(0, 300, 7))))
    ref.step(lambda s: s.append(*rand_records(rng, variable_lengths(lengths, 12))))
    ref.step(lambda s: s.replace([4, 8], *rand_records(rng, [5, 5000])))
    ref.step(lambda s: s.compact())
    return ref.finish()


BUILDERS = {
    "fixed": build_fixed,
    "indexed": build_indexed,
    "dictionary": build_dictionary,
    "garbage": build_garbage,
    "converted": build_converted,
}


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, Reference]:
    root = tmp_path_factory.mktemp("references")
    refs = {name: build(root / name) for name, build in BUILDERS.items()}
    for name, ref in refs.items():
        assert max(ref.accepted) - 1 in ref.accepted, name
        room = [
            max((len(s[i]) for s in ref.accepted.values() if i < len(s)), default=0)
            for i in range(max(len(s) for s in ref.accepted.values()))
        ]
        ref.spec = root / f"{name}.json"
        ref.spec.write_text(json.dumps({"room": room, "read_limit": len(room)}))
        ref.digests = {g: [worker.digest(r) for r in s] for g, s in ref.accepted.items()}
    assert {f.split("-")[0] for ref in refs.values() for f in ref.files} >= {
        "superblock",
        "lock",
        "data",
        "index",
        "sums",
        "dict",
    }
    yield refs
    shutil.rmtree(root)


# ---- the damage --------------------------------------------------------------


def damage(path: Path, rng: random.Random) -> tuple[str, str, str]:
    """Damages one file of the store at `path`; returns what it did, to which
    kind of file, with which kind of damage."""
    files = sorted(os.listdir(path))
    weights = [
        {"superblock": 4, "lock": 1, "data": 4, "index": 4, "sums": 3, "dict": 3, "journal": 2}[
            f.split("-")[0]
        ]
        for f in files
    ]
    name = rng.choices(files, weights)[0]
    target = path / name
    data = bytearray(target.read_bytes())
    kind = rng.choices(
        ["flip", "bytes", "zero_page", "truncate", "delete", "extend"], [33, 20, 15, 20, 7, 5]
    )[0]
    if not data and kind in ("flip", "bytes", "zero_page", "truncate"):
        kind = "extend"

    def offset() -> int:
        if name == "superblock" and rng.random() < 0.8:
            return rng.choice([0, worker.SLOT_BYTES]) + rng.randrange(worker.SUPERBLOCK_BYTES)
        return rng.randrange(len(data))

    if kind == "flip":
        spots = [(offset(), rng.randrange(8)) for _ in range(rng.randint(1, 4))]
        for at, bit in spots:
            data[at] ^= 1 << bit
        what = f"flipped bits (offset, bit) {spots}"
    elif kind == "bytes":
        at = offset()
        count = min(rng.randint(1, 8), len(data) - at)
        data[at : at + count] = bytes(rng.randrange(256) for _ in range(count))
        what = f"overwrote {count} bytes at {at}"
    elif kind == "zero_page":
        page = rng.randrange((len(data) + 4095) // 4096)
        data[page * 4096 : (page + 1) * 4096] = bytes(len(data[page * 4096 : (page + 1) * 4096]))
        what = f"zeroed page {page}"
    elif kind == "truncate":
        size = rng.choice([0, len(data) - 1, rng.randrange(len(data))])
        data = data[:size]
        what = f"truncated to {size} of {len(target.read_bytes())} bytes"
    elif kind == "delete":
        target.unlink()
        return f"{name}: deleted", name.split("-")[0], kind
    else:
        extra = rng.randint(1, 9000)
        data += bytes(rng.randrange(256) for _ in range(extra))
        what = f"appended {extra} garbage bytes"
    target.write_bytes(bytes(data))
    return f"{name}: {what}", name.split("-")[0], kind


HOSTILE_VALUES = (
    0,
    1,
    2,
    7,
    31,
    32,
    4096,
    1 << 16,
    1 << 31,
    1 << 32,
    (1 << 32) + 1,
    1 << 40,
    1 << 47,
    (1 << 48) - 1,
    1 << 48,
    (1 << 48) + 1,
    1 << 56,
    1 << 63,
    (1 << 64) - 1,
)


def reseal(path: Path, rng: random.Random) -> str:
    """Rewrites fields of a superblock slot with hostile values and a valid checksum."""
    raw = bytearray((path / "superblock").read_bytes())
    slots = worker.read_slots(path)
    newest = max(range(len(slots)), key=lambda i: slots[i]["generation"])
    slot = newest if rng.random() < 0.8 else 1 - newest
    base = slot * worker.SLOT_BYTES
    changes = []
    fields = slots[slot]
    if rng.random() < 0.35 and fields["layout"] in (1, 2):
        # Lies that pass every check the superblock can make on itself.
        if fields["layout"] == 1:
            stride = rng.choice([1, 3, 64, 199, 201, 4096, 20000, fields["data_bytes"] or 1])
            count = fields["data_bytes"] // stride
            lies = {
                "record_bytes": stride,
                "record_count": count,
                "data_bytes": stride * count,
                "live_bytes": stride * count,
                "tail_checksum": fields["tail_checksum"],
            }
        else:
            lies = rng.choice(
                [
                    {"record_count": rng.randrange(fields["record_count"] + 1)},
                    {"data_bytes": rng.randrange(fields["live_bytes"], fields["data_bytes"] + 1)},
                    {"data_bytes": fields["data_bytes"] + rng.randint(1, 70000)},
                    {"index_file": fields["data_file"], "data_file": fields["index_file"]},
                ]
            )
        for field, value in lies.items():
            struct.pack_into("<Q", raw, base + worker.FIELD_OFFSETS[field], value)
            changes.append(f"{field} {fields[field]} -> {value}")
    for _ in range(0 if changes else rng.choice([1, 1, 1, 2, 3])):
        field = rng.choice(worker.FIELDS[1:])  # everything but the version
        at = base + worker.FIELD_OFFSETS[field]
        width = 4 if field == "layout" else 8
        old = int.from_bytes(raw[at : at + width], "little")
        value = rng.choice(
            HOSTILE_VALUES
            + (old + 1, old - 1 if old else 0, old * 2, old // 2, rng.getrandbits(64))
        )
        value &= (1 << (8 * width)) - 1
        raw[at : at + width] = value.to_bytes(width, "little")
        changes.append(f"{field} {old} -> {value}")
    raw[base : base + worker.SUPERBLOCK_BYTES] = worker.seal(
        raw[base : base + worker.SUPERBLOCK_BYTES]
    )
    (path / "superblock").write_bytes(bytes(raw))
    return f"superblock slot {slot} resealed with {', '.join(changes)}"


# ---- running and judging one case ---------------------------------------------


def check_in_subprocess(path: Path, spec: Path) -> tuple[int, dict | None, str]:
    try:
        proc = subprocess.run(
            [sys.executable, WORKER, "check", str(path), str(spec)],
            capture_output=True,
            text=True,
            timeout=CASE_TIMEOUT_S,
        )
    except subprocess.TimeoutExpired:
        return 0, None, f"hung: no answer within {CASE_TIMEOUT_S} s"
    report = None
    if proc.stdout.strip():
        report = json.loads(proc.stdout.strip().splitlines()[-1])
    return proc.returncode, report, proc.stderr[-2000:]


def judge(report: dict, ref: Reference, strict: bool) -> list[str]:
    """What is wrong with a case's outcome (empty when it is acceptable)."""
    problems = []
    outcomes = [
        v for k, v in report.items() if k.startswith("open") or k in ("verify", "plain_gather")
    ]
    outcomes += report.get("single", []) + [
        b for _, b in report.get("batches", []) if isinstance(b, str)
    ]
    for value in outcomes:
        if isinstance(value, str) and value.startswith("X:"):
            problems.append(f"raised something other than ZrecordError: {value}")
    if report["maxrss_kib"] > RSS_LIMIT_KIB:
        problems.append(f"used {report['maxrss_kib']} KiB of memory")
    if report.get("open_True") != "ok" or not strict:
        return problems
    generation, n = report["generation"], report["n"]
    if generation not in ref.accepted:
        return problems + [
            f"opened at generation {generation}; only {sorted(ref.accepted)} were committed last"
        ]
    expected = ref.digests[generation]
    if n != len(expected):
        return problems + [
            f"generation {generation} holds {len(expected)} records but the store says {n}"
        ]
    single = report["single"]
    for i, got in enumerate(single):
        if not got.startswith(("E:", "X:")) and got != expected[i]:
            problems.append(f"read({i}) returned wrong bytes")
    for idxs, got in report["batches"]:
        if isinstance(got, list):
            wrong = [i for i, d in zip(idxs, got) if d != expected[i]]
            if wrong:
                problems.append(f"gather returned wrong bytes for records {wrong}")
    verified = report["verify"]
    if isinstance(verified, list):
        unflagged = [
            i for i, got in enumerate(single) if got.startswith(("E:", "X:")) and i not in verified
        ]
        if unflagged:
            problems.append(f"records {unflagged} fail to read but verify() returned {verified}")
    return problems


def run_case(
    root: Path, refs: dict[str, Reference], case: int, hostile: bool
) -> tuple[str | None, str, str]:
    """Damages a copy of one reference store and judges the outcome: the
    failure message (None when acceptable), the file kind and damage kind."""
    rng = random.Random(f"{BASE_SEED}:{case}:{hostile}")
    name = sorted(refs)[case % len(refs)]
    ref = refs[name]
    path = root / f"{'hostile' if hostile else 'case'}-{case}-{name}"
    shutil.copytree(ref.path, path)
    what, file_kind, damage_kind = (
        (reseal(path, rng), "superblock", "reseal") if hostile else damage(path, rng)
    )
    returncode, report, stderr = check_in_subprocess(path, ref.spec)
    if returncode < 0:
        when = "after printing its report (at exit)" if report else "while reading"
        problems = [f"killed by signal {-returncode} {when}"]
    elif report is None or returncode != 0:
        problems = [f"exit {returncode}: {stderr}"]
    else:
        problems = judge(report, ref, strict=not hostile)
    if not problems:
        shutil.rmtree(path)
        return None, file_kind, damage_kind
    return (
        (
            f"{name} store, {what} (LOADERX_SEED={BASE_SEED}, case {case}); damaged copy kept at "
            f"{path}:\n    "
            + "\n    ".join(problems[:6])
            + (f"\n    stderr: {stderr[-800:]}" if stderr.strip() else "")
        ),
        file_kind,
        damage_kind,
    )


def run_cases(
    root: Path, refs: dict[str, Reference], count: int, hostile: bool
) -> tuple[list[str], set]:
    """Runs `count` cases on two processes; returns the failures and the
    (file kind, damage kind) pairs covered."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda case: run_case(root, refs, case, hostile), range(count)))
    return [r for r, _, _ in results if r], {(f, d) for _, f, d in results}


def test_random_damage_to_every_file_gives_right_bytes_or_a_zrecord_error(tmp_path, references):
    """CASES flipped bits, overwritten bytes, zeroed pages, truncations,
    deletions and extensions across every file of five stores (fixed,
    indexed, with a dictionary, with garbage, converted and compacted)."""
    failures, covered = run_cases(tmp_path, references, CASES, hostile=False)
    assert {f for f, _ in covered} == {
        "superblock",
        "lock",
        "data",
        "index",
        "sums",
        "dict",
        "journal",
    }
    assert {d for _, d in covered} == {"flip", "bytes", "zero_page", "truncate", "delete", "extend"}
    assert not failures, f"{len(failures)} of {CASES} damaged stores misbehaved:\n" + "\n".join(
        failures[:40]
    )


def test_hostile_superblocks_with_valid_checksums_never_crash(tmp_path, references):
    """A superblock whose fields lie (wild counts, lengths, file ids) behind a
    valid checksum: a ZrecordError or some bytes, never a signal, a hang or a
    wild allocation."""
    failures, _ = run_cases(tmp_path, references, HOSTILE_CASES, hostile=True)
    assert not failures, (
        f"{len(failures)} of {HOSTILE_CASES} hostile stores misbehaved:\n"
        + "\n".join(failures[:40])
    )


@pytest.mark.soak
def test_damage_soak(tmp_path, references):
    """The random cases, SOAK_CASES (LOADERX_CASES, default 3000) of each kind."""
    failures, _ = run_cases(tmp_path, references, SOAK_CASES, hostile=False)
    failures += run_cases(tmp_path, references, SOAK_CASES // 4, hostile=True)[0]
    assert not failures, f"{len(failures)} damaged stores misbehaved:\n" + "\n".join(failures[:20])


# ---- named cases -----------------------------------------------------------------


@pytest.fixture
def store_copy(tmp_path, references):
    def copy(name: str) -> tuple[Path, Reference]:
        path = tmp_path / name
        shutil.copytree(references[name].path, path)
        return path, references[name]

    return copy


def rewrite_slots(path: Path, edit, slots=(0, 1)) -> None:
    raw = bytearray((path / "superblock").read_bytes())
    for slot in slots:
        base = slot * worker.SLOT_BYTES
        body = bytearray(raw[base : base + worker.SUPERBLOCK_BYTES])
        edit(body)
        raw[base : base + worker.SUPERBLOCK_BYTES] = worker.seal(body)
    (path / "superblock").write_bytes(bytes(raw))


def newest_slot(path: Path) -> int:
    slots = worker.read_slots(path)
    return max(range(2), key=lambda i: slots[i]["generation"])


def test_the_python_superblock_checksum_matches_the_store(references):
    """The test's XXH3 reproduces the checksums the store writes, so the
    resealed cases below are sealed exactly as the store would seal them."""
    for ref in references.values():
        assert all(slot["sealed"] for slot in worker.read_slots(ref.path))


def test_wrong_magic_is_not_a_store(store_copy):
    """Both slots with a foreign magic: CorruptStoreError saying so."""
    path, _ = store_copy("indexed")
    rewrite_slots(path, lambda body: body.__setitem__(slice(0, 8), b"NOTASTOR"))
    with pytest.raises(CorruptStoreError, match="not a zrecord store"):
        Zrecord(path)


def test_newer_format_version_is_refused(store_copy):
    """Both slots written by a newer format (valid checksums): refused, with
    a message that says to upgrade."""
    path, _ = store_copy("indexed")
    rewrite_slots(path, lambda body: struct.pack_into("<I", body, 8, 2))
    with pytest.raises(CorruptStoreError, match="version") as info:
        Zrecord(path)
    assert "upgrade" in str(info.value)


def test_newer_format_version_in_the_newest_slot_is_refused(store_copy):
    """Only the newest slot carries a newer version (a newer loaderx made the
    last commit): reading the older slot instead would silently show a stale
    store, and a writer would then truncate the newer commit's bytes."""
    path, ref = store_copy("indexed")
    rewrite_slots(path, lambda body: struct.pack_into("<I", body, 8, 2), slots=(newest_slot(path),))
    with pytest.raises(CorruptStoreError, match="version"):
        store = Zrecord(path)
        stale = (len(store), store.stats()["generation"])
        store.close()
        pytest.fail(
            f"opened the older slot: {stale[0]} records at generation {stale[1]} "
            f"instead of {len(ref.accepted[max(ref.accepted)])} at {max(ref.accepted)}"
        )


@pytest.mark.parametrize("name", ["fixed", "indexed"])
def test_truncated_data_file_is_named_at_open(store_copy, name):
    """A data file shorter than the superblock says: CorruptStoreError at open naming the file."""
    path, _ = store_copy(name)
    data = next(f for f in os.listdir(path) if f.startswith("data-"))
    size = os.path.getsize(path / data)
    os.truncate(path / data, size // 2)
    with pytest.raises(CorruptStoreError, match=data):
        Zrecord(path)


@pytest.mark.parametrize("kind", ["data", "index", "sums", "dict"])
def test_missing_store_file_is_named_at_open(store_copy, kind):
    """A file the superblock names is gone: CorruptStoreError naming it."""
    path, _ = store_copy(
        {"data": "indexed", "index": "indexed", "sums": "fixed", "dict": "dictionary"}[kind]
    )
    victim = next(f for f in os.listdir(path) if f.startswith(kind + "-"))
    os.unlink(path / victim)
    with pytest.raises(CorruptStoreError, match=victim):
        Zrecord(path)


def test_missing_superblock_with_data_files_is_refused(store_copy):
    """Store files without a superblock: refused (not silently re-created empty)."""
    path, _ = store_copy("indexed")
    os.unlink(path / "superblock")
    with pytest.raises(CorruptStoreError, match="superblock"):
        Zrecord(path)
    assert not (path / "superblock").exists()


# The lock file's shared page: `synced_generation` and its check (zig/format.zig JournalPage).
SYNCED_OFFSET = 40


def forget_synced_generation(path: Path) -> None:
    """Zeroes the lock page's record of the last synced generation: what a
    writer killed (or a power cut) before it recorded its last commit leaves,
    like a store written by an older loaderx."""
    raw = bytearray((path / "lock").read_bytes())
    raw[SYNCED_OFFSET : SYNCED_OFFSET + 16] = bytes(16)
    (path / "lock").write_bytes(bytes(raw))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_a_torn_newest_slot_falls_back_to_the_previous_commit(store_copy, name):
    """A newest slot that fails its checksum while nothing records that its
    commit finished (a commit cut short by a crash): readers see the previous
    commit exactly (or a clear error if that commit's files are gone), it is
    no damage, and a writer recovers from it: the store takes new writes and
    holds only the files it names."""
    path, ref = store_copy(name)
    raw = bytearray((path / "superblock").read_bytes())
    raw[newest_slot(path) * worker.SLOT_BYTES + 100] ^= 0x10
    (path / "superblock").write_bytes(bytes(raw))
    forget_synced_generation(path)
    previous = max(ref.accepted) - 1
    try:
        store = Zrecord(path, verify=True)
    except CorruptStoreError as exc:
        # The newest commit replaced a file the previous one names.
        assert "missing" in str(exc)
        return
    with store:
        stats = store.stats()
        assert (stats["generation"], stats["fell_back"], stats["damaged"]) == (
            previous,
            True,
            False,
        )
        assert "cut short by a crash" in stats["fell_back_reason"]
        assert contents(store) == ref.accepted[previous]
        assert store.verify() == []
    with Zrecord(path, codec="zstd") as store:
        store.append(b"after the fallback", [0])
        assert contents(store) == ref.accepted[previous] + [b"after the fallback"]
    named = worker.named_files(worker.committed_superblock(path))
    on_disk = {
        f: os.path.getsize(path / f) for f in os.listdir(path) if f not in ("superblock", "lock")
    }
    assert on_disk == named


def zero_slot(raw: bytearray, slot: int) -> None:
    raw[slot * worker.SLOT_BYTES : (slot + 1) * worker.SLOT_BYTES] = bytes(worker.SLOT_BYTES)


def flip_slot(raw: bytearray, slot: int) -> None:
    raw[slot * worker.SLOT_BYTES + 37] ^= 0x04  # in record_count: the magic stays


def swap_slots(raw: bytearray, slot: int) -> None:
    first, second = bytes(raw[: worker.SLOT_BYTES]), bytes(raw[worker.SLOT_BYTES :])
    raw[:] = second + first


SLOT_DAMAGE = {"zeroed": zero_slot, "flipped": flip_slot, "swapped": swap_slots}


@pytest.fixture(scope="module")
def converted_store(tmp_path_factory):
    """The issue's store: `from_numpy("dd", np.arange(1000.0))`, whose
    slots hold generations 0 and 2 (the conversion commits unsynced, then syncs)."""
    from loaderx import from_numpy

    path = tmp_path_factory.mktemp("converted") / "dd"
    from_numpy(path, np.arange(1000.0))
    assert [slot["generation"] for slot in worker.read_slots(path)] == [0, 2]
    return path


# (store, damage, which slot) -> (generation opened, fell_back, damaged).
# "newest"/"older": the slot holding the store's newest / older generation.
SLOT_CASES = {
    ("dd", "zeroed", "newest"): (0, True, True),
    ("dd", "zeroed", "older"): (2, True, True),
    ("dd", "flipped", "newest"): (0, True, True),
    ("dd", "flipped", "older"): (2, True, False),
    ("indexed", "zeroed", "newest"): ("previous", True, True),
    ("indexed", "zeroed", "older"): ("final", True, True),
    ("indexed", "flipped", "newest"): ("previous", True, True),
    ("indexed", "flipped", "older"): ("final", True, False),
    ("dd", "swapped", "both"): (2, False, False),
    ("indexed", "swapped", "both"): ("final", False, False),
}


@pytest.mark.parametrize("case", sorted(SLOT_CASES), ids="-".join)
def test_every_slot_damage_has_its_exact_outcome(case, tmp_path, references, converted_store):
    """Each way a superblock slot can be damaged, in the newest and in the
    older slot: the generation open takes, and whether it says it fell back
    and whether it is damage. Damage (a slot that held a commit lost its
    magic, or the lock file records a synced generation the slots no longer
    hold) makes verify() raise and writes refuse. A flipped older slot is
    what a torn commit leaves (the next commit writes that slot): reported,
    not damage, and the next commit rewrites it. Swapped slots both decode:
    open takes the newest, and the writer goes on from it."""
    name, damage_kind, which = case
    source = converted_store if name == "dd" else references[name].path
    path = tmp_path / name
    shutil.copytree(source, path)
    final = worker.committed_superblock(path)["generation"]
    with Zrecord(path) as store:
        records = len(store)
    newest = newest_slot(path)
    raw = bytearray((path / "superblock").read_bytes())
    SLOT_DAMAGE[damage_kind](raw, newest if which in ("newest", "both") else 1 - newest)
    (path / "superblock").write_bytes(bytes(raw))
    expected_generation, fell_back, damaged = SLOT_CASES[case]
    expected_generation = {"final": final, "previous": final - 1}.get(
        expected_generation, expected_generation
    )
    with Zrecord(path) as store:
        stats = store.stats()
        assert (stats["generation"], stats["fell_back"], stats["damaged"]) == (
            expected_generation,
            fell_back,
            damaged,
        )
        assert (stats["fell_back_reason"] is None) == (not fell_back)
        if damaged:
            assert (
                "damaged" in stats["fell_back_reason"]
                or "no longer holds it" in stats["fell_back_reason"]
            )
            with pytest.raises(CorruptStoreError, match="is damaged"):
                store.verify()
            with pytest.raises(CorruptStoreError, match="Writes are refused"):
                store.append(b"more", [0])
        else:
            assert store.verify() == []
            if expected_generation == final and name == "dd":
                assert len(store) == records
    if not damaged:  # a writer goes on from the state it opened, and a reopen agrees
        with Zrecord(path) as store:
            store.append(b"more", [0])
            after = len(store)
        with Zrecord(path) as store:
            assert len(store) == after and store.stats()["fell_back"] is False


@pytest.mark.parametrize("which", ["newest", "older"])
def test_a_truncated_superblock_file_is_refused_whichever_slot_it_cuts(
    tmp_path, converted_store, which
):
    """A superblock file cut to one slot (slot 1 holds the converted store's
    newest generation, so cutting it drops the newest; with the slots swapped
    it drops the older): refused at open, never opened at the slot left."""
    path = tmp_path / "dd"
    shutil.copytree(converted_store, path)
    raw = bytearray((path / "superblock").read_bytes())
    if which == "older":
        swap_slots(raw, 0)
    (path / "superblock").write_bytes(bytes(raw[: worker.SLOT_BYTES]))
    with pytest.raises(CorruptStoreError, match="superblock file holds 4096 bytes"):
        Zrecord(path)


def test_loaderx_verify_fails_on_a_zeroed_newest_slot(tmp_path, converted_store, capsys):
    """The issue's case end to end: a zeroed newest slot made `loaderx
    verify` print "ok, 0 records verified" and exit 0; now it says the store
    opened older than it committed and exits 1. A torn commit (nothing
    records it as synced) still verifies, with a note."""
    from loaderx.cli import main

    path = tmp_path / "dd"
    shutil.copytree(converted_store, path)
    raw = bytearray((path / "superblock").read_bytes())
    zero_slot(raw, 1)
    (path / "superblock").write_bytes(bytes(raw))
    assert main(["verify", str(path)]) == 1
    out = capsys.readouterr().out
    assert (
        "DAMAGED, opened at an older state than it committed" in out
        and "generation 2 was committed" in out
    )
    flip = bytearray((converted_store / "superblock").read_bytes())
    flip_slot(flip, 1)
    (path / "superblock").write_bytes(bytes(flip))
    forget_synced_generation(path)
    assert main(["verify", str(path)]) == 0
    assert (
        "ok, 0 records verified (note: superblock slot 1 does not decode" in capsys.readouterr().out
    )


def test_damaged_records_are_named_by_verify_and_refused_by_verified_reads(store_copy):
    """One flipped payload byte in an indexed store: verify() names exactly
    that record, a verified read raises ChecksumError, the others read right."""
    path, ref = store_copy("indexed")
    records = ref.accepted[max(ref.accepted)]
    with Zrecord(path) as store:
        victim = max(range(len(records)), key=lambda i: len(records[i]))
        others = [i for i in range(len(records)) if i != victim]
    data = next(f for f in os.listdir(path) if f.startswith("data-"))
    # Find the victim's stored bytes: the only byte flip that verify() pins on it.
    size = os.path.getsize(path / data)
    original = (path / data).read_bytes()
    for at in range(0, size, 97):
        damaged = bytearray(original)
        damaged[at] ^= 0xFF
        (path / data).write_bytes(bytes(damaged))
        with Zrecord(path, verify=True) as store:
            if store.verify() == [victim]:
                with pytest.raises(ChecksumError):
                    store.read(victim)
                assert [store.read(i) for i in others] == [records[i] for i in others]
                return
    pytest.fail(f"no byte of {data} belongs to record {victim}")


@pytest.mark.parametrize("size", [0, 100, 4096, 4096 + 255, 8191, 8193, 12288])
def test_a_superblock_file_cut_or_grown_by_someone_else_is_refused(store_copy, size):
    """zrecord writes its superblock file whole, 8,192 bytes, and never
    changes its length: any other length is damage, and open says so instead
    of falling back to an older (even empty) generation."""
    path, _ = store_copy(sorted(BUILDERS)[0])
    raw = (path / "superblock").read_bytes()
    assert len(raw) == 8192
    (path / "superblock").write_bytes((raw + bytes(8192))[:size])
    with pytest.raises(CorruptStoreError, match="superblock file holds"):
        Zrecord(path)


def test_an_intact_store_does_not_report_a_fall_back(store_copy):
    path, _ = store_copy(sorted(BUILDERS)[0])
    with Zrecord(path) as store:
        assert store.stats()["fell_back"] is False


# ---- writes over damaged blocks: refused, never blessed ------------------------------
#
# A fixed store's writes that carry committed bytes into new checksums (an
# in-place replace patches a block and sums it again, an append extends the
# partial tail block, a delete rewrites the data, a replace in another codec
# converts the store to entries checksummed from the data) would give a
# damaged block the checksum of its damaged bytes: verify() would pass from
# then on, and the wrong bytes would read as good. Each is refused instead.

ROW_BYTES = 40  # ten float32
FIXED_ROWS = 1000  # 40,000 bytes: blocks 0 and 1 whole, block 2 the partial tail
BLOCK = 16 * 1024


def fixed_raw_store(path: Path) -> np.ndarray:
    values = np.arange(FIXED_ROWS * 10, dtype=np.float32).reshape(FIXED_ROWS, 10)
    with Zrecord(path, codec="raw") as store:
        store.append(values, np.arange(FIXED_ROWS, dtype=np.uint64) * ROW_BYTES)
    return values


def flip_data_byte(path: Path, offset: int) -> None:
    (data,) = path.glob("data-*")
    with open(data, "r+b") as file:
        file.seek(offset)
        byte = file.read(1)
        file.seek(offset)
        file.write(bytes([byte[0] ^ 0x10]))


def rows_of(block: int) -> list[int]:
    end = min((block + 1) * BLOCK, FIXED_ROWS * ROW_BYTES)
    return list(range(block * BLOCK // ROW_BYTES, (end - 1) // ROW_BYTES + 1))


def new_row(values: np.ndarray, index: int) -> np.ndarray:
    return values[index] + 0.5


WRITES_OVER_DAMAGE = {
    # name: (the damaged block, the write)
    "in-place replace": (
        0,
        lambda store, values: store.replace([7], new_row(values, 7), [0], codec="raw"),
    ),
    "in-place replace of the tail": (
        2,
        lambda store, values: store.replace([999], new_row(values, 999), [0], codec="raw"),
    ),
    "in-place replace of several rows": (
        1,
        lambda store, values: store.replace(
            [3, 420, 600],
            np.stack([new_row(values, i) for i in (3, 420, 600)]),
            [0, 40, 80],
            codec="raw",
        ),
    ),
    "append": (
        2,
        lambda store, values: store.append(values[:3], np.arange(3, dtype=np.uint64) * 40),
    ),
    "delete": (1, lambda store, values: store.delete([5])),
    "replace in another codec": (
        1,
        lambda store, values: store.replace([7], new_row(values, 7), [0], codec="zstd"),
    ),
}


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "durable=False"])
@pytest.mark.parametrize("name", list(WRITES_OVER_DAMAGE))
def test_a_write_over_a_damaged_block_is_refused_and_changes_nothing(tmp_path, name, durable):
    block, write = WRITES_OVER_DAMAGE[name]
    path = tmp_path / "s"
    values = fixed_raw_store(path)
    flip_data_byte(path, block * BLOCK + 21)
    damaged = rows_of(block)
    with Zrecord(path, durable=durable) as store:
        assert store.verify() == damaged
        with pytest.raises(
            CorruptStoreError, match=rf"block {block} .*does not match its checksum"
        ):
            write(store, values)
        # The handle goes on: a write that touches no damaged block works.
        sound = next(i for i in range(FIXED_ROWS) if i not in damaged and i not in (3, 5, 7))
        if name.startswith("in-place"):
            store.replace([sound], new_row(values, sound), [0], codec="raw")
            values[sound] = new_row(values, sound)
        assert store.verify() == damaged
    with Zrecord(path) as store:
        assert len(store) == FIXED_ROWS
        assert store.verify() == damaged  # still named: the damage was not blessed
        out = np.empty_like(values)
        store.gather(np.arange(FIXED_ROWS, dtype=np.uint64), out)
        intact = np.setdiff1d(np.arange(FIXED_ROWS), damaged)
        assert np.array_equal(out[intact], values[intact])


@pytest.mark.parametrize("chunk", [1, 137, 409, 410, 1 << 20])
@pytest.mark.parametrize("blocks", [(0,), (1,), (0, 1), (0, 2), (0, 1, 2)])
def test_verify_names_every_record_of_each_damaged_block_in_ranges_of_any_size(
    tmp_path, monkeypatch, blocks, chunk
):
    """verify() hashes each block once for all the records in it: a record
    across two damaged blocks is named once, one across a damaged and a sound
    block is named, and a range that starts or ends inside a block (verify
    asks the core ``chunk`` records at a time) names the same records."""
    from loaderx import zrecord

    path = tmp_path / "s"
    fixed_raw_store(path)
    for block in blocks:
        flip_data_byte(path, block * BLOCK + 3)
    monkeypatch.setattr(zrecord, "_VERIFY_CHUNK", chunk)
    with Zrecord(path) as store:
        assert store.verify() == sorted({row for block in blocks for row in rows_of(block)})


@pytest.mark.parametrize("block", [0, 2], ids=["a whole block", "the tail"])
def test_replacing_every_record_verify_names_repairs_the_store(tmp_path, block):
    """The way out the refusal names: replace the damaged records whole."""
    path = tmp_path / "s"
    values = fixed_raw_store(path)
    flip_data_byte(path, block * BLOCK + 5)
    with Zrecord(path) as store:
        damaged = store.verify()
        assert damaged == rows_of(block)
        rows = np.ascontiguousarray(values[damaged])
        offsets = np.arange(len(damaged), dtype=np.uint64) * ROW_BYTES
        store.replace(damaged, rows, offsets, codec="raw")
        assert store.verify() == []
    with Zrecord(path) as store:
        out = np.empty_like(values)
        store.gather(np.arange(FIXED_ROWS, dtype=np.uint64), out)
        assert np.array_equal(out, values) and store.verify() == []


def test_an_array_store_replace_over_a_damaged_block_is_refused(tmp_path):
    from loaderx import ArrayStore

    values = np.arange(FIXED_ROWS * 10, dtype=np.float32).reshape(FIXED_ROWS, 10)
    with ArrayStore(tmp_path / "a") as arrays:
        arrays.save({"x": values})
    flip_data_byte(tmp_path / "a" / "x", 3 * ROW_BYTES + 2)
    for durable in (True, False):
        with ArrayStore(tmp_path / "a", durable=durable) as arrays:
            with pytest.raises(CorruptStoreError, match="does not match its checksum"):
                arrays.replace({"x": np.zeros((1, 10), np.float32)}, [0])
    with Zrecord(tmp_path / "a" / "x") as store:
        assert store.verify() == rows_of(0)


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "durable=False"])
@pytest.mark.parametrize("blocks", [(100, 400), (400,)], ids=["both parts", "the second part"])
def test_a_scattered_replace_over_damaged_blocks_names_the_first_and_changes_nothing(
    tmp_path, durable, blocks
):
    """A replace of rows in hundreds of blocks checks them on two threads,
    each a part of the rows; with damage in either part or both it reports
    the first damaged block, as one thread would (a pool thread's message
    stays on that thread), and writes no row."""
    rows_total, step = 200_000, 1_000  # rows 40,000 bytes apart: a group each
    values = np.arange(rows_total * 10, dtype=np.float32).reshape(rows_total, 10)
    path = tmp_path / "s"
    with Zrecord(path, codec="raw") as store:
        store.append(values, np.arange(rows_total, dtype=np.uint64) * ROW_BYTES)
    # Blocks 100 and 400 lie in the first and second half of the rows; rows
    # 41,000 and 164,000 lie in them, neither replaced whole.
    for block in blocks:
        flip_data_byte(path, block * BLOCK + 7)
    indices = np.arange(0, rows_total, step, dtype=np.uint64)
    assert {41_000 * ROW_BYTES // BLOCK, 164_000 * ROW_BYTES // BLOCK} == {100, 400}
    rows = np.full((len(indices), 10), -1, np.float32)
    offsets = np.arange(len(indices), dtype=np.uint64) * ROW_BYTES
    with Zrecord(path, durable=durable) as store:
        first = blocks[0]
        named = rf"^block {first} of the data file \(records {first * BLOCK // ROW_BYTES} "
        with pytest.raises(CorruptStoreError, match=named):
            store.replace(indices, rows, offsets, codec="raw")
        store.sync()
    with Zrecord(path, verify=False) as store:
        out = np.empty_like(values)
        store.gather(np.arange(rows_total, dtype=np.uint64), out)
        differ = np.flatnonzero(out.view(np.uint8).reshape(-1) != values.view(np.uint8).reshape(-1))
        assert differ.tolist() == [block * BLOCK + 7 for block in blocks]  # the flips, no row
        assert store.verify() == [
            row
            for block in blocks
            for row in range(block * BLOCK // ROW_BYTES, ((block + 1) * BLOCK - 1) // ROW_BYTES + 1)
        ]


# ---- ArrayStore's own rewrites: damage is refused, never carried over ----------------
#
# A rewrite (compact or clone of an array with dropped rows, a batch that
# rewrites arrays whole, a pack) reads the raw rows unchecked and writes
# them with fresh checksums: damage read there would pass every check
# after. Each checks the rows it carries over first; rows it drops or
# writes anew may be damaged (that is the way to repair).


def damaged_array_store(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """Arrays ``x`` (1,000 rows of 40 bytes, block 0 damaged at row 3) and ``y``."""
    from loaderx import ArrayStore

    x = np.arange(FIXED_ROWS * 10, dtype=np.float32).reshape(FIXED_ROWS, 10)
    y = np.arange(50, dtype=np.int64)
    with ArrayStore(path) as arrays:
        arrays.save({"x": x, "y": y})
    flip_data_byte(path / "x", 3 * ROW_BYTES + 2)
    return x, y


def x_verify(path: Path) -> list[int]:
    with Zrecord(path / "x") as store:
        return store.verify()


def x_replace(arrays, rows):
    arrays.replace({"x": np.full((len(rows), 10), -1, np.float32)}, rows)


def x_edit_both(arrays):
    x_replace(arrays, [500])  # block 1: sound
    arrays.replace({"y": np.array([-1])}, [0])


def x_append_in_batch(arrays):
    arrays.append({"x": np.zeros((2, 10), np.float32)})


def x_writable_both(arrays):
    arrays.load("x")[500] = -1
    arrays.load("y")[0] = -1


ARRAY_REWRITES_OVER_DAMAGE = {
    # name: (the call that rewrites x, what it refuses as)
    "compact after a row drop": (
        lambda arrays: (arrays.drop("x", [900]), arrays.compact()),
        "compact",
    ),
    "clone of an array with row drops": (
        lambda arrays: (arrays.drop("x", [900]), arrays.clone("x", "z")),
        "clone 'x' to 'z'",
    ),
    "batch_mode over two arrays": (
        lambda arrays: _in_batch(arrays.batch_mode, arrays, x_edit_both),
        "commit the batch",
    ),
    "batch_mode append": (
        lambda arrays: _in_batch(arrays.batch_mode, arrays, x_append_in_batch),
        "commit the batch",
    ),
    "writable_batch_mode over two arrays": (
        lambda arrays: _in_batch(arrays.writable_batch_mode, arrays, x_writable_both),
        "commit the batch",
    ),
    "pack": (lambda arrays: arrays.pack(arrays.path + ".pack"), "pack"),
}


def _in_batch(mode, arrays, edit):
    with mode():
        edit(arrays)


@pytest.mark.parametrize("durable", [True, False], ids=["durable", "durable=False"])
@pytest.mark.parametrize("name", list(ARRAY_REWRITES_OVER_DAMAGE))
def test_an_array_store_rewrite_refuses_to_carry_damage(tmp_path, name, durable):
    from loaderx import ArrayStore

    rewrite, what = ARRAY_REWRITES_OVER_DAMAGE[name]
    path = tmp_path / "a"
    x, y = damaged_array_store(path)
    damaged = rows_of(0)
    assert x_verify(path) == damaged
    with ArrayStore(path, durable=durable) as arrays:
        with pytest.raises(CorruptStoreError, match=rf"cannot {what}.*rows 0, 1, 2, 3, 4"):
            rewrite(arrays)
        assert not arrays.has_array("z")
        assert np.array_equal(arrays.load("y"), y)  # a batch's other edits: discarded
    assert not (tmp_path / "a.pack").exists()
    assert x_verify(path) == damaged  # still named, not blessed
    with ArrayStore(path) as arrays:
        rows = np.arange(FIXED_ROWS)
        if "drop" in name:
            rows = np.delete(rows, 900)
        loaded = arrays.load("x")
        intact = ~np.isin(rows, damaged)
        assert len(loaded) == rows.size
        assert np.array_equal(loaded[intact], x[rows[intact]])


def test_dropping_the_damaged_rows_then_compacting_repairs_the_array(tmp_path):
    from loaderx import ArrayStore

    path = tmp_path / "a"
    x, _ = damaged_array_store(path)
    damaged = rows_of(0)
    with ArrayStore(path) as arrays:
        arrays.drop("x", damaged)
        arrays.compact()
        assert np.array_equal(arrays.load("x"), x[len(damaged) :])
    assert x_verify(path) == []


@pytest.mark.parametrize("mode", ["batch_mode", "writable_batch_mode"])
def test_a_batch_that_rewrites_every_damaged_row_repairs_the_array(tmp_path, mode):
    """Rows a batch writes whole are not carried over, damaged or not."""
    from loaderx import ArrayStore

    path = tmp_path / "a"
    x, y = damaged_array_store(path)
    damaged = rows_of(0)
    with ArrayStore(path) as arrays:
        with getattr(arrays, mode)():
            if mode == "batch_mode":
                x_replace(arrays, damaged)
                arrays.replace({"y": np.array([-1])}, [0])
            else:
                arrays.load("x")[damaged] = -1
                arrays.load("y")[0] = -1
        x[damaged] = -1
        y[0] = -1
        assert np.array_equal(arrays.load("x"), x) and np.array_equal(arrays.load("y"), y)
    assert x_verify(path) == []


def test_a_batch_that_drops_the_damaged_rows_commits(tmp_path):
    from loaderx import ArrayStore

    path = tmp_path / "a"
    x, _ = damaged_array_store(path)
    damaged = rows_of(0)
    with ArrayStore(path) as arrays:
        with arrays.batch_mode():
            arrays.drop("x", damaged[:200])  # rows shift: the next drop names them anew
            arrays.drop("x", list(range(len(damaged) - 200)))
            arrays.append({"x": np.zeros((1, 10), np.float32)})
        expect = np.concatenate([x[len(damaged) :], np.zeros((1, 10), np.float32)])
        assert np.array_equal(arrays.load("x"), expect)
    assert x_verify(path) == []


def test_a_batch_that_saves_over_a_damaged_array_commits(tmp_path):
    from loaderx import ArrayStore

    path = tmp_path / "a"
    damaged_array_store(path)
    with ArrayStore(path) as arrays:
        with arrays.batch_mode():
            x = arrays.load("x")  # read (damaged) and then replaced whole
            arrays.save({"x": np.ones_like(x)})
            arrays.replace({"y": np.array([-1])}, [0])
        assert np.array_equal(arrays.load("x"), np.ones_like(x))
    assert x_verify(path) == []
