"""Behaviour of the zrecord store through its Python binding."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import zstandard
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from loaderx.zrecord import (
    CODECS,
    MAX_RECORD_LEN,
    DestinationOverlapError,
    InvalidArgumentError,
    NoDictionaryError,
    StoreClosedError,
    StoreLockedError,
    StoreReplacedError,
    Zrecord,
    ZrecordError,
)


def pack(records):
    """Records packed back to back, with their start offsets."""
    offsets = np.zeros(len(records), dtype=np.uint64)
    if records:
        offsets[1:] = np.cumsum([len(r) for r in records[:-1]])
    return b"".join(records), offsets


def read_all(store):
    """Every record of the store, through one batch gather."""
    count = len(store)
    if count == 0:
        return []
    lengths = store.lengths(np.arange(count))
    offsets = np.zeros(count, dtype=np.uint64)
    offsets[1:] = np.cumsum(lengths[:-1])
    buffer = bytearray(int(lengths.sum()))
    store.gather(np.arange(count), buffer, offsets)
    return [bytes(buffer[int(o) : int(o) + int(n)]) for o, n in zip(offsets, lengths)]


def compressible(size, seed):
    """Bytes that zstd shrinks: a small alphabet with runs."""
    rng = np.random.default_rng(seed)
    return (rng.integers(0, 4, size, dtype=np.uint8) * 17).tobytes()


def store_files(path):
    return sorted(name for name in os.listdir(path) if "-" in name)


@pytest.mark.parametrize("codec", ["raw", "zstd", "zstd_dict"])
@pytest.mark.parametrize("size", [0, 5, (1 << 20) + 1, 16 << 20])
def test_round_trip_every_codec_and_size_survives_reopen(tmp_path, codec, size):
    """Records of 0 B to 16 MiB come back byte for byte, before and after reopening."""
    path = tmp_path / "store"
    records = [compressible(size, seed) for seed in range(3)]
    with Zrecord(path, codec=codec) as store:
        if codec == "zstd_dict":
            samples = [compressible(512, 100 + i) for i in range(400)]
            store.train_dict(b"".join(samples), [len(s) for s in samples], 4096)
        source, offsets = pack(records)
        assert store.append(source, offsets) == 0
        assert read_all(store) == records
    with Zrecord(path) as store:
        assert len(store) == 3
        assert read_all(store) == records
        assert store.verify() == []


def test_raw_equal_length_records_use_the_fixed_layout_with_no_table(tmp_path):
    """1M int64 labels stored raw cost at most 1% + a few KiB over their 8 MB."""
    labels = np.arange(1_000_000, dtype=np.int64)
    with Zrecord(tmp_path / "labels", codec="raw") as store:
        store.append(labels, np.arange(labels.size, dtype=np.uint64) * 8)
        assert store.stats()["layout"] == "fixed"
        out = np.empty(5, dtype=np.int64)
        store.gather([7, 999_999, 0, 7, 123], out)
        assert out.tolist() == [7, 999_999, 0, 7, 123]
    total = sum(
        os.path.getsize(tmp_path / "labels" / name) for name in os.listdir(tmp_path / "labels")
    )
    assert total <= labels.nbytes * 1.01 + 16 * 1024


def test_fixed_store_turns_indexed_when_a_record_does_not_fit(tmp_path):
    """A longer or compressed record converts the layout and keeps every record."""
    with Zrecord(tmp_path / "s", codec="raw") as store:
        store.append(b"aaaabbbb", [0, 4])
        store.append(b"cc", [0], codec="zstd")
        assert store.stats()["layout"] == "indexed"
        assert read_all(store) == [b"aaaa", b"bbbb", b"cc"]
        assert len(store_files(tmp_path / "s")) == 2  # data + index, the sums file is gone


def test_zstd_records_are_standard_frames(tmp_path):
    """Every stored zstd record decodes with python-zstandard, dictionary ones with the
    dictionary."""
    path = tmp_path / "s"
    records = [compressible(3000, seed) for seed in range(20)]
    with Zrecord(path, codec="zstd") as store:
        store.append(*pack(records))
        samples = [compressible(700, 50 + i) for i in range(300)]
        store.train_dict(b"".join(samples), [len(s) for s in samples], 2048)
        store.append(*pack(records), codec="zstd_dict")
        stats = store.stats()
    # Read the frames straight from the files, using the documented format.
    superblock = (path / "superblock").read_bytes()
    slots = [np.frombuffer(superblock[i * 4096 : i * 4096 + 256], dtype="<u8") for i in range(2)]
    slot = max(slots, key=lambda s: s[2])  # word 2 is the generation
    data_id, index_id, dict_id = int(slot[5]), int(slot[7]), int(slot[11])
    data = (path / f"data-{data_id:016x}").read_bytes()
    index = (path / f"index-{index_id:016x}").read_bytes()
    entries = np.frombuffer(index, dtype="<u8").reshape(-1, 4)
    dictionary = zstandard.ZstdCompressionDict((path / f"dict-{dict_id:016x}").read_bytes())
    assert len(entries) == stats["records"] == 40
    for k, (offset, raw_bytes, stored_codec, _checksum) in enumerate(entries):
        stored, codec = int(stored_codec) & ((1 << 56) - 1), int(stored_codec) >> 56
        frame = data[int(offset) : int(offset) + stored]
        assert codec == (CODECS["zstd"] if k < 20 else CODECS["zstd_dict"])
        decoder = zstandard.ZstdDecompressor(dict_data=dictionary if codec == 2 else None)
        assert decoder.decompress(frame) == records[k % 20]
        assert raw_bytes == len(records[k % 20])


def test_incompressible_records_are_stored_raw(tmp_path):
    """A record that zstd does not shrink costs its raw size, not a frame's."""
    noise = np.random.default_rng(1).bytes(10_000)
    with Zrecord(tmp_path / "s", codec="zstd") as store:
        store.append(noise + noise[:10_000], [0, 10_000])
        assert store.stats()["live_bytes"] == 20_000
        assert store.read(1) == noise


def test_more_than_2_pow_24_records(tmp_path):
    """The 0.9 line's 2^24-record limit is gone: 2^24 + 5 one-byte records."""
    count = (1 << 24) + 5
    values = (np.arange(count) % 251).astype(np.uint8)
    with Zrecord(tmp_path / "s", codec="raw") as store:
        store.append(values, np.arange(count, dtype=np.uint64))
        assert len(store) == count
        out = np.empty(3, dtype=np.uint8)
        store.gather([count - 1, 1 << 24, 3], out)
        assert out.tolist() == [values[-1], values[1 << 24], 3]


def test_fixed_gather_into_too_small_buffer_writes_nothing(tmp_path):
    """Equal raw records (the fixed layout) are size-checked as one batch."""
    with Zrecord(tmp_path / "s", codec="raw") as store:
        store.append(b"abcdefghijkl", [0, 4, 8])
        assert store.stats()["layout"] == "fixed"
        dst = bytearray(b"." * 11)
        with pytest.raises(
            ZrecordError, match="does not fit the destination: it has 11 bytes, the batch needs 12"
        ):
            store.gather([2, 0, 1], dst)
        assert dst == bytearray(b"." * 11)
        out = bytearray(8)
        store.gather([2, 0], out)
        assert out == bytearray(b"ijklabcd")


def test_gather_into_offsets_and_out_of_range(tmp_path):
    """Records land at the given offsets; bad indices and small buffers raise and write nothing."""
    with Zrecord(tmp_path / "s") as store:
        store.append(b"abcdefgh", [0, 3, 5])
        dst = bytearray(b"........")
        store.gather([2, 0], dst, [0, 4])
        assert bytes(dst) == b"fgh.abc."
        with pytest.raises(IndexError, match="out of range"):
            store.gather([3], bytearray(3), [0])
        with pytest.raises(IndexError, match="negative"):
            store.gather([-1], bytearray(3), [0])
        with pytest.raises(ZrecordError, match="does not fit"):
            store.gather([0], bytearray(2), [0])
        frozen = np.zeros(3, np.uint8)
        frozen.flags.writeable = False
        with pytest.raises(ValueError, match="read-only"):
            store.gather([0], frozen, [0])
        strided = np.zeros((4, 2), np.uint8)[:, 0]
        with pytest.raises(ValueError, match="C-contiguous"):
            store.gather([0], strided, [0])
        assert read_all(store) == [b"abc", b"de", b"fgh"]


def test_gather_without_offsets_needs_equal_lengths(tmp_path):
    """Without offsets records land at k * length; records of other lengths are refused."""
    with Zrecord(tmp_path / "s") as store:
        store.append(b"abcdefgh", [0, 3, 6])
        dst = bytearray(6)
        store.gather([1, 0], dst)
        assert bytes(dst) == b"defabc"
        with pytest.raises(ZrecordError, match="explicit destination offsets"):
            store.gather([0, 2], bytearray(6))


def test_disk_full_mid_append_keeps_committed_data(tmp_path):
    """A write that runs out of space raises StoreFullError; the store keeps every commit."""
    path = tmp_path / "s"
    code = f"""
import resource, signal, numpy as np
from loaderx.zrecord import Zrecord, StoreFullError
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
store = Zrecord({str(path)!r}, codec="raw")
store.append(b"x" * 1000, [0, 500])
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, hard))
try:
    store.append(np.zeros(1_000_000, np.uint8), [0, 500_000])
except StoreFullError as exc:
    print("full:", exc)
assert len(store) == 2 and store.read(1) == b"x" * 500
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
store.append(b"y" * 500, [0])
print("after:", len(store))
"""
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
    )
    assert "full: cannot write 'data-" in result.stdout and "free some space" in result.stdout, (
        result.stdout + result.stderr
    )
    assert "after: 3" in result.stdout
    with Zrecord(path) as store:
        assert read_all(store) == [b"x" * 500, b"x" * 500, b"y" * 500]
        assert store.verify() == []


def test_bad_writes_raise_and_change_nothing(tmp_path):
    """Every rejected write leaves the store as it was."""
    with Zrecord(tmp_path / "s", codec="zstd") as store:
        store.append(b"abcdef", [0, 3])
        before = read_all(store), store.stats()["generation"]
        with pytest.raises(ValueError, match="unknown codec"):
            store.append(b"x", [0], codec="brotli")
        with pytest.raises(ValueError, match="empty batch"):
            store.append(b"", [])
        with pytest.raises(ValueError, match="non-decreasing"):
            store.append(b"abc", [0, 2, 1])
        with pytest.raises(ValueError, match="past the end"):
            store.append(b"abc", [0, 4])
        with pytest.raises(ValueError, match="C-contiguous"):
            store.append(np.zeros((4, 4), np.uint8)[:, 1], [0])
        with pytest.raises(NoDictionaryError, match="train_dict"):
            store.append(b"abc", [0], codec="zstd_dict")
        with pytest.raises(IndexError):
            store.replace([5], b"x", [0])
        with pytest.raises(ZrecordError, match="twice"):
            store.replace([0, 0], b"xy", [0, 1])
        with pytest.raises(ValueError, match="indices but"):
            store.replace([0, 1], b"x", [0])
        with pytest.raises(IndexError):
            store.delete([2])
        with pytest.raises(ValueError, match="no indices"):
            store.delete([])
        with pytest.raises(ZrecordError, match="more and more varied samples"):
            store.train_dict(b"abc" * 3, [3, 3, 3], 1024)
        assert (read_all(store), store.stats()["generation"]) == before
    assert MAX_RECORD_LEN >= 2 << 30


def test_delete_modes_and_replace_and_compact(tmp_path):
    """Swap-fill and order-keeping deletes, replace with other lengths, compaction reclaims."""
    records = [bytes([65 + i]) * (i + 1) for i in range(10)]
    with Zrecord(tmp_path / "s", codec="zstd") as store:
        store.append(*pack(records))
        store.delete([8, 2, 5], keep_order=False)
        assert read_all(store) == [records[i] for i in (0, 1, 7, 3, 4, 9, 6)]
        store.delete([0], keep_order=True)
        assert read_all(store) == [records[i] for i in (1, 7, 3, 4, 9, 6)]
        store.replace([1, 4], b"xyz" + b"q" * 5000, [0, 3])
        assert read_all(store)[1] == b"xyz" and read_all(store)[4] == b"q" * 5000
        assert store.stats()["reclaimable"] > 0
        expected = read_all(store)
        store.compact()
        assert store.stats()["reclaimable"] == 0
        assert read_all(store) == expected
        assert len(store_files(tmp_path / "s")) == 2


def test_second_writer_is_refused_and_readers_are_not(tmp_path):
    """One writer per store: another handle's first write raises; reads never lock."""
    path = tmp_path / "s"
    with Zrecord(path) as writer:
        writer.append(b"abc", [0])
        with Zrecord(path) as other:
            assert other.read(0) == b"abc"
            with pytest.raises(StoreLockedError, match="one writer per store"):
                other.append(b"x", [0])
            code = (
                "import sys; from loaderx.zrecord import Zrecord, StoreLockedError\n"
                f"s = Zrecord({str(path)!r})\n"
                "assert s.read(0) == b'abc'\n"
                "try:\n    s.append(b'x', [0])\n"
                "except StoreLockedError as e:\n    print('refused:', e)\n"
            )
            result = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
            )
            assert "refused" in result.stdout, result.stderr
    with Zrecord(path) as again:  # the lock went with the first writer
        again.append(b"d", [0])
        assert read_all(again) == [b"abc", b"d"]


def test_reader_sees_a_consistent_prefix_after_refresh(tmp_path):
    """A reader opened before appends sees its old prefix, and the new records after refresh()."""
    path = tmp_path / "s"
    with Zrecord(path) as writer, Zrecord(path) as reader:
        writer.append(b"ab", [0, 1])
        assert len(reader) == 0
        assert reader.refresh() == 2
        writer.delete([0], keep_order=True)
        assert read_all(reader) == [b"a", b"b"]  # its snapshot is intact
        reader.refresh()
        assert read_all(reader) == [b"b"]


@pytest.mark.parametrize("as_array", [False, True], ids=["list", "uint64 array"])
def test_offsets_that_skip_bytes_or_run_past_the_source_are_refused(tmp_path, as_array):
    """A uint64 offsets array takes the fast path; its two checks refuse as
    the full checks do, and nothing is written."""
    with Zrecord(tmp_path / "s") as store:
        store.append(b"abcd", [0, 2])

        def offsets(values):
            return np.array(values, dtype=np.uint64) if as_array else values

        with pytest.raises(InvalidArgumentError, match=r"offsets\[0\] is 1"):
            store.append(b"abcd", offsets([1, 2]))
        with pytest.raises(InvalidArgumentError, match=r"offsets\[-1\] = 5 is past the end"):
            store.replace([0, 1], b"abcd", offsets([0, 5]))
        assert read_all(store) == [b"ab", b"cd"]


def test_close_waits_for_calls_in_flight_and_wakes_when_the_last_ends(tmp_path):
    """close() from another thread returns once the gathers in flight end
    (the last one to leave wakes it), and no gather starts after it."""
    rows = np.random.default_rng(0).random((4000, 256), dtype=np.float32)
    store = Zrecord(tmp_path / "s", codec="zstd", threads=1)
    store.append(rows, np.arange(len(rows), dtype=np.uint64) * rows[0].nbytes)
    out = np.empty_like(rows)
    indices = np.arange(len(rows), dtype=np.uint64)
    started, outcomes, looping = threading.Barrier(3), [], threading.Event()

    def gather_until_closed():
        started.wait()
        done = 0
        try:
            while True:
                store.gather(indices, out)
                done += 1
                looping.set()
        except StoreClosedError:
            outcomes.append(done)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcomes.append(exc)

    threads = [threading.Thread(target=gather_until_closed) for _ in range(2)]
    for thread in threads:
        thread.start()
    started.wait()
    assert looping.wait(30)  # the gathers are under way (each takes milliseconds)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(30)
    assert not closer.is_alive(), "close() never returned: no call woke it"
    assert store._active == 0
    for thread in threads:
        thread.join(30)
    assert len(outcomes) == 2 and all(isinstance(done, int) for done in outcomes), outcomes
    assert np.array_equal(out, rows)


def test_use_after_close_raises_and_close_is_idempotent(tmp_path):
    """Every call on a closed store raises StoreClosedError instead of touching freed memory."""
    store = Zrecord(tmp_path / "s")
    store.append(b"a", [0])
    store.close()
    store.close()
    for call in (
        lambda: len(store),
        lambda: store.read(0),
        lambda: store.append(b"a", [0]),
        lambda: store.delete([0]),
        store.compact,
        store.sync,
        store.stats,
        store.verify,
    ):
        with pytest.raises(StoreClosedError, match="closed"):
            call()


def test_gather_while_another_thread_appends(tmp_path):
    """Gathers racing appends, deletes and compactions always see whole, correct records."""
    record = lambda i: bytes([i % 256]) * (100 + i % 50)  # noqa: E731
    with Zrecord(tmp_path / "s", codec="zstd", threads=2) as store:
        store.append(*pack([record(i) for i in range(200)]))
        stop = threading.Event()
        failures = []

        def reader():
            while not stop.is_set():
                try:
                    indices = np.arange(150)
                    lengths = store.lengths(indices)
                    offsets = np.concatenate([[0], np.cumsum(lengths[:-1])]).astype(np.uint64)
                    buffer = bytearray(int(lengths.sum()))
                    store.gather(indices, buffer, offsets)
                    for i in range(150):
                        if buffer[int(offsets[i]) : int(offsets[i]) + int(lengths[i])] != record(i):
                            failures.append(i)
                except Exception as exc:  # noqa: BLE001 - collected and asserted below
                    failures.append(exc)

        threads = [threading.Thread(target=reader) for _ in range(2)]
        for thread in threads:
            thread.start()
        for k in range(30):
            store.append(*pack([record(200 + 5 * k + j) for j in range(5)]))
            store.delete([len(store) - 1], keep_order=True)
            if k % 10 == 0:
                store.compact()
        stop.set()
        for thread in threads:
            thread.join()
        assert failures == []


def test_readonly_directory_reads_but_refuses_writes():
    """A store in a read-only directory opens and reads; a write raises a clear error.

    Root ignores permissions, so the reader drops to an unprivileged user
    (after importing loaderx) when the tests run as root."""
    import shutil
    import tempfile

    base = tempfile.mkdtemp(prefix="zrecord-ro-")
    try:
        os.chmod(base, 0o755)
        path = os.path.join(base, "s")
        with Zrecord(path) as store:
            store.append(b"abc", [0])
        for name in os.listdir(path):
            os.chmod(os.path.join(path, name), 0o444)
        os.chmod(path, 0o555)
        code = (
            "import os\nfrom loaderx.zrecord import Zrecord, ZrecordError\n"
            "if os.geteuid() == 0:\n    os.setuid(65534)\n"
            f"s = Zrecord({path!r})\n"
            "assert s.read(0) == b'abc'\n"
            "try:\n    s.append(b'x', [0])\nexcept ZrecordError as e:\n    print('refused:', e)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60
        )
        assert "refused: cannot write store" in result.stdout and "read-only" in result.stdout, (
            result.stdout + result.stderr
        )
        os.chmod(path, 0o755)
        with Zrecord(path) as store:
            assert read_all(store) == [b"abc"]
    finally:
        for root, dirs, _files in os.walk(base):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o755)
        shutil.rmtree(base, ignore_errors=True)


def test_path_that_is_a_file_is_not_a_store(tmp_path):
    """Opening a regular file or a foreign superblock raises instead of creating anything."""
    (tmp_path / "file").write_bytes(b"hello")
    with pytest.raises(ZrecordError, match="not a store directory"):
        Zrecord(tmp_path / "file")
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "superblock").write_bytes(b"\x00" * 8192)
    with pytest.raises(ZrecordError, match="not a zrecord store"):
        Zrecord(tmp_path / "foreign")


# ---- a stateful model test ---------------------------------------------------------

record_bytes = st.binary(min_size=0, max_size=300)


class StoreMachine(RuleBasedStateMachine):
    """Random append / delete / replace / compact / sync / reopen against a list."""

    def __init__(self):
        super().__init__()
        import tempfile

        self.directory = tempfile.mkdtemp(prefix="zrecord-model-")
        self.path = os.path.join(self.directory, "store")
        self.store = None
        self.model = []

    @initialize()
    def open_store(self):
        self.store = Zrecord(self.path, codec="zstd")

    @rule(
        records=st.lists(record_bytes, min_size=1, max_size=8),
        codec=st.sampled_from(["raw", "zstd"]),
    )
    def append(self, records, codec):
        first = self.store.append(*pack(records), codec=codec)
        assert first == len(self.model)
        self.model.extend(records)

    @rule(count=st.integers(1, 8), length=st.integers(0, 40), seed=st.integers(0, 1000))
    def append_fixed(self, count, length, seed):
        records = [bytes([(seed + i) % 256]) * length for i in range(count)]
        self.store.append(*pack(records), codec="raw")
        self.model.extend(records)

    @precondition(lambda self: self.model)
    @rule(data=st.data(), keep_order=st.booleans())
    def delete(self, data, keep_order):
        indices = data.draw(st.lists(st.integers(0, len(self.model) - 1), min_size=1, max_size=6))
        self.store.delete(indices, keep_order=keep_order)
        doomed = sorted(set(indices))
        if keep_order:
            self.model = [r for i, r in enumerate(self.model) if i not in set(doomed)]
        else:
            remaining = len(self.model) - len(doomed)
            holes = [i for i in doomed if i < remaining]
            sources = [i for i in range(remaining, len(self.model)) if i not in set(doomed)]
            for hole, source in zip(holes, sources):
                self.model[hole] = self.model[source]
            del self.model[remaining:]

    @precondition(lambda self: self.model)
    @rule(data=st.data(), codec=st.sampled_from(["raw", "zstd"]))
    def replace(self, data, codec):
        indices = data.draw(
            st.lists(st.integers(0, len(self.model) - 1), min_size=1, max_size=5, unique=True)
        )
        same_length = data.draw(st.booleans())
        if same_length:
            records = [bytes([7]) * len(self.model[i]) for i in indices]
        else:
            records = data.draw(
                st.lists(record_bytes, min_size=len(indices), max_size=len(indices))
            )
        self.store.replace(indices, *pack(records), codec=codec)
        for index, record in zip(indices, records):
            self.model[index] = record

    @rule()
    def compact(self):
        self.store.compact()

    @rule()
    def sync(self):
        self.store.sync()

    @rule()
    def reopen(self):
        self.store.close()
        self.store = Zrecord(self.path, codec="zstd", verify=True)

    @invariant()
    def matches_model(self):
        if self.store is None:
            return
        assert len(self.store) == len(self.model)
        assert read_all(self.store) == self.model
        stats = self.store.stats()
        assert stats["records"] == len(self.model)
        assert stats["reclaimable"] == stats["chunk_bytes"] - stats["live_bytes"]

    def teardown(self):
        if self.store is not None:
            assert self.store.verify() == []
            self.store.close()
        import shutil

        shutil.rmtree(self.directory, ignore_errors=True)


TestStoreMachine = StoreMachine.TestCase
TestStoreMachine.settings = settings(
    max_examples=150,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


# ---- regressions of issue 11 ---------------------------------------------------------


def test_append_offsets_must_start_at_zero(tmp_path):
    """append(b"abcdef", [2, 4]) used to drop the first two bytes; now it is refused and writes
    nothing."""
    with Zrecord(tmp_path / "store", codec="raw") as store:
        with pytest.raises(ValueError, match="start at 0"):
            store.append(b"abcdef", [2, 4])
        assert len(store) == 0
        store.append(b"abcdef", [0, 4])
        with pytest.raises(ValueError, match="start at 0"):
            store.replace([0], b"wxyz", [1])
        assert read_all(store) == [b"abcd", b"ef"]


@pytest.mark.parametrize(
    "offsets, overlapping",
    [
        ([0, 8], True),  # the case: the second record overwrote the first
        ([8, 0], True),  # unsorted offsets are checked too
        ([16, 0], False),
        ([0, 16], False),
        ([40, 0, 20], False),
        ([0, 40, 10], True),  # record 0 at [0, 16) and record 2 at [10, 26), not adjacent
    ],
)
def test_gather_refuses_overlapping_destination_ranges(tmp_path, offsets, overlapping):
    """Two records whose destination ranges overlap are refused before anything is written."""
    with Zrecord(tmp_path / "store", codec="zstd") as store:
        store.append(b"a" * 16 + b"b" * 16 + b"c" * 16, [0, 16, 32])
        indices = [0, 1, 2][: len(offsets)]
        buffer = bytearray(64)
        if overlapping:
            with pytest.raises(DestinationOverlapError, match="overlap") as caught:
                store.gather(indices, buffer, offsets)
            assert isinstance(caught.value, ValueError) and caught.value.code == 1
            assert buffer == bytearray(64)
        else:
            store.gather(indices, buffer, offsets)
            for index, offset in zip(indices, offsets):
                assert buffer[offset : offset + 16] == b"abc"[index : index + 1] * 16


def test_gather_empty_records_never_overlap(tmp_path):
    """A zero-length record writes nothing, so it may share an offset with another record."""
    with Zrecord(tmp_path / "store", codec="raw") as store:
        store.append(b"xy", [0, 0])  # record 0 is empty, record 1 is b"xy"
        buffer = bytearray(2)
        store.gather([0, 1, 0], buffer, [1, 0, 1])
        assert buffer == bytearray(b"xy")


def test_open_refuses_a_foreign_non_empty_directory(tmp_path):
    """Zrecord(dir) on a non-empty directory that is not a store writes nothing into it, unless
    create=True."""
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"meow")
    with pytest.raises(ZrecordError, match="not a zrecord store") as caught:
        Zrecord(foreign)
    assert caught.value.code == 10
    assert os.listdir(foreign) == ["cat.jpg"]
    with Zrecord(foreign, create=True) as store:
        store.append(b"abc", [0])
    assert "superblock" in os.listdir(foreign)
    with Zrecord(foreign) as store:  # now a store: opens without create
        assert read_all(store) == [b"abc"]
    (tmp_path / "empty").mkdir()
    with Zrecord(tmp_path / "empty") as store:
        assert len(store) == 0


def test_refresh_after_the_directory_was_replaced_says_so(tmp_path):
    """A handle whose directory was swapped for a new store reports that, not damage."""
    with Zrecord(tmp_path / "store", codec="raw") as writer:
        writer.append(b"abcd", [0])
    reader = Zrecord(tmp_path / "store")
    os.rename(tmp_path / "store", tmp_path / "old")
    with Zrecord(tmp_path / "store", codec="raw") as writer:
        writer.append(b"efgh", [0])
    import shutil

    shutil.rmtree(tmp_path / "old")
    with pytest.raises(StoreReplacedError, match="was replaced"):
        reader.refresh()
    reader.close()


def test_store_pickles_as_its_path(tmp_path):
    """A pickled store opens again at its path with its options; a closed one refuses."""
    import pickle

    with Zrecord(tmp_path / "store", codec="raw", verify=True, threads=2) as store:
        store.append(b"abcdef", [0, 3])
        copy = pickle.loads(pickle.dumps(store))
    with copy:
        assert (copy.path, copy.codec, copy.verify_reads) == (str(tmp_path / "store"), "raw", True)
        assert read_all(copy) == [b"abc", b"def"]
    with pytest.raises(TypeError, match="closed"):
        pickle.dumps(copy)


def _flip_record_byte(path, store, index, record):
    """Flips one byte of record ``index`` (stored raw: zstd did not shrink it)
    in the data file, found by its bytes."""
    data = next(f for f in os.listdir(path) if f.startswith("data-"))
    raw = bytearray((path / data).read_bytes())
    at = raw.index(record)
    raw[at + len(record) // 2] ^= 0xFF
    (path / data).write_bytes(bytes(raw))


def test_reads_check_checksums_by_default_where_it_costs_little(tmp_path):
    """A record zstd did not shrink is stored raw even in a zstd store: a
    flipped bit in it came back as wrong data unless verify=True. Reads of the
    indexed layout are now checked by default; verify=False still skips the
    check, and the fixed layout (raw records of one length) stays unchecked
    unless verify=True (its checksums cover 16 KiB blocks)."""
    from loaderx.zrecord import ChecksumError

    rng = np.random.default_rng(0)
    records = [rng.integers(0, 256, 300, dtype=np.uint8).tobytes() for _ in range(3)]
    path = tmp_path / "zstd"
    with Zrecord(path, codec="zstd") as store:
        store.append(*pack(records))
        assert (
            store.stats()["layout"] == "indexed" and store.stats()["live_bytes"] == 900
        )  # stored raw
    _flip_record_byte(path, None, 1, records[1])
    with Zrecord(path) as store:
        with pytest.raises(ChecksumError, match="record 1"):
            store.read(1)
        assert store.read(0) == records[0]
    with Zrecord(path, verify=False) as store:
        assert store.read(1) != records[1]  # the explicit override: unchecked
    fixed = tmp_path / "fixed"
    with Zrecord(fixed, codec="raw") as store:
        store.append(*pack(records))
        assert store.stats()["layout"] == "fixed"
    _flip_record_byte(fixed, None, 1, records[1])
    with Zrecord(fixed) as store:
        assert store.read(1) != records[1]  # the default leaves the fixed layout unchecked
        assert 1 in store.verify()  # its block fails: every record in it is named
    with Zrecord(fixed, verify=True) as store:
        with pytest.raises(ChecksumError):
            store.read(1)
    with pytest.raises(TypeError, match="verify must be"):
        Zrecord(path, verify="yes")


def test_codec_table_comes_from_the_core():
    """CODECS is read from zig/format.zig (lx_codec_get), with the ids the
    store format has always had; shuffle_bytes is the core's shuffle."""
    from loaderx.zrecord import CODECS, SHUFFLE_ELEMENT_BYTES, codec_parts, shuffle_bytes

    assert CODECS == {
        "raw": 0x00,
        "zstd": 0x01,
        "zstd_dict": 0x02,
        "zstd_shuffle2": 0x11,
        "zstd_shuffle4": 0x21,
        "zstd_shuffle8": 0x31,
        "zstd_dict_shuffle2": 0x12,
        "zstd_dict_shuffle4": 0x22,
        "zstd_dict_shuffle8": 0x32,
        "lz4": 0x03,
        "lz4_shuffle2": 0x13,
        "lz4_shuffle4": 0x23,
        "lz4_shuffle8": 0x33,
    }
    assert SHUFFLE_ELEMENT_BYTES == (2, 4, 8)
    assert codec_parts("zstd_dict_shuffle4")[2:] == (4, True)
    assert codec_parts(0x01)[2:] == (1, False)
    record = np.random.default_rng(0).integers(0, 256, 4 * 1000 + 3, dtype=np.uint8)
    for element_bytes in SHUFFLE_ELEMENT_BYTES:
        whole = record.size // element_bytes * element_bytes
        planes = record[:whole].reshape(-1, element_bytes).T.reshape(-1)
        np.testing.assert_array_equal(
            shuffle_bytes(record, element_bytes), np.concatenate([planes, record[whole:]])
        )
    assert shuffle_bytes(np.empty(0, np.uint8), 4).size == 0
