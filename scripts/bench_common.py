"""What the bench scripts share: the records they time, the batch, and the
table format. `bench.py` and the scripts it runs (`bench_codecs.py`,
`bench_ceilings.py`, ...) import it; it imports none of them."""

from __future__ import annotations

import os

import numpy as np

LOADER_WORKERS = 4
RECORD_FLOATS = 3072  # one record: 3072 float32, 12 KiB
RECORD_BYTES = RECORD_FLOATS * 4
BATCH_SIZE = 256
MiB = 1 << 20


def structured_rows(count: int, seed: int = 0) -> np.ndarray:
    """`count` mildly compressible float32 records, like sensor or feature data.

    Each row is a sum of three random sinusoids plus small Gaussian noise,
    quantized to 2**-16: the quantization zeroes the low mantissa bits, so
    zstd finds about 1.3x, far from the 5-15x of smooth images or text.
    """
    rng = np.random.default_rng(seed)
    grid = np.linspace(0.0, 1.0, RECORD_FLOATS, dtype=np.float32)
    rows = np.empty((count, RECORD_FLOATS), dtype=np.float32)
    for start in range(0, count, 1024):
        block = rows[start : start + 1024]
        shape = (len(block), 3, 1)
        frequency = rng.uniform(1.0, 8.0, shape).astype(np.float32)
        phase = rng.uniform(0.0, 2 * np.pi, shape).astype(np.float32)
        amplitude = rng.uniform(0.2, 1.0, shape).astype(np.float32)
        signal = (amplitude * np.sin(2 * np.pi * frequency * grid + phase)).sum(axis=1)
        signal += rng.standard_normal(signal.shape, dtype=np.float32) * np.float32(0.01)
        block[:] = np.round(signal * 65536) / 65536
    return rows


def cores() -> int:
    """The cores this process may run on."""
    return (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
