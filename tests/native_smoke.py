"""Smoke run of every native entry point, for one build of the library.

    LOADERX_CPU=baseline python tests/native_smoke.py

Run by tests/test_packaging.py natively for each bundled CPU level and under
an emulated older CPU (qemu-x86_64 -cpu Nehalem). It checks results against
NumPy and prints `smoke ok <variant> <digest>`: the digest covers every
sampler mode's indices and the loader's batches, so the builds of all CPU
levels must print the same one. Exits non-zero (an assertion) on any mismatch.
"""

import hashlib
import shutil
import tempfile
from pathlib import Path

import numpy as np

from loaderx import DataLoader, DenseDataset, Sampler, Zrecord, _native, from_numpy

ROWS = 3000


def check_stores(workdir: Path, data: np.ndarray) -> dict:
    """from_numpy with every codec, then gathers compared with NumPy's take."""
    indices = [3, 0, ROWS - 1, 17, 3]
    datasets = {}
    for codec in ("raw", "zstd"):
        from_numpy(workdir / codec, data, codec=codec, progress=False)
        dataset = DenseDataset(workdir / codec)
        assert np.array_equal(dataset.__getitems__(indices), data[indices]), codec
        datasets[codec] = dataset
    with Zrecord(workdir / "records") as store:
        records = [b"first", b"", b"third record" * 100]
        offsets = np.cumsum([0] + [len(r) for r in records[:-1]])
        store.append(b"".join(records), offsets)
        out = bytearray(len(records[2]) + len(records[0]))
        store.gather([2, 0], out, [0, len(records[2])])
        assert bytes(out) == records[2] + records[0]
        assert store.verify() == []
    return datasets


def check_samplers(digest) -> None:
    """Every sampler mode: indices in range, sequential and cyclic exactly as specified."""
    length, batch = 1000, 64
    for mode in (Sampler.Mode.SEQUENTIAL, Sampler.Mode.IID, Sampler.Mode.CYCLIC):
        sampler = Sampler(length, batch, mode, seed=7)
        batches = [sampler.next() for _ in range(length // batch)]
        every = np.concatenate(batches)
        assert every.min() >= 0 and every.max() < length, mode
        if mode == Sampler.Mode.SEQUENTIAL:
            assert np.array_equal(every, np.arange(len(every))), mode
        if mode == Sampler.Mode.CYCLIC:
            assert len(np.unique(every)) == len(every), "a cycle repeated an index"
        digest.update(every.tobytes())
    # BLOCK: uneven groups, blocks of 2 (the Feistel path for the 600-row group).
    groups = [1, 99, 600, 7, 293]
    sampler = Sampler(length, batch, Sampler.Mode.BLOCK, seed=7, groups=groups, shards_per_block=2)
    every = np.concatenate([sampler.next() for _ in range(length // batch)])
    assert len(np.unique(every)) == len(every) and every.max() < length, "BLOCK"
    digest.update(every.tobytes())


def check_loader(dataset: DenseDataset, data: np.ndarray, digest) -> None:
    """The threaded DataLoader's batch k is the data at the sampler's step k."""
    sampler = Sampler(ROWS, 32, Sampler.Mode.IID, seed=3)
    with DataLoader({"x": dataset}, num_workers=2, batch_size=32, mode=1, seed=3) as loader:
        for step, batch in zip(range(20), loader):
            assert np.array_equal(batch["x"], data[sampler.batch(step).astype(np.int64)]), step
            digest.update(batch["x"].tobytes())


def main() -> None:
    workdir = Path(tempfile.mkdtemp(prefix="loaderx-smoke-"))
    try:
        data = np.arange(ROWS * 6, dtype=np.float32).reshape(ROWS, 6) % 251
        datasets = check_stores(workdir, data)
        digest = hashlib.sha256()
        check_samplers(digest)
        check_loader(datasets["zstd"], data, digest)
    finally:
        shutil.rmtree(workdir)
    print("smoke ok", _native.VARIANT, digest.hexdigest())


if __name__ == "__main__":
    main()
