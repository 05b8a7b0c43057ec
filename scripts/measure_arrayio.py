"""Peak memory of ArrayStore's converters and pack files on an array larger than a chunk.

    python scripts/measure_arrayio.py [--mib 512] [--formats npy,hdf5,...]

For each format, one child process each imports an N MiB float32 array
from a file of that format into an ArrayStore, exports it back, and packs
and unpacks the store; while it runs, a thread samples the child's
anonymous resident memory (RssAnon in /proc/self/status, every 2 ms), which
is what the converter allocates (page-cache pages of mapped files are not
counted there; VmHWM, which counts them, is printed too). The table shows
the peak above the child's baseline (after its imports). The source files
are written by another child in chunks, so no process holds the array whole.
Not a test: tests/test_arrayio.py checks a bound on one format.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SRC = str(Path(__file__).resolve().parent.parent / "src")
FORMATS = ["npy", "npz", "safetensors", "hdf5", "zarr", "parquet", "feather", "csv", "pt"]
SUFFIX = {"hdf5": "h5", "pt": "pt"}

CHILD = r"""
import os, sys, threading, time
import numpy as np
import loaderx
from loaderx import ArrayStore
try:
    import h5py, zarr, torch, pyarrow, safetensors  # load them before the baseline
except ImportError:
    pass

def anon():
    with open("/proc/self/status") as status:
        fields = dict(line.split(":", 1) for line in status)
    return int(fields["RssAnon"].split()[0]) * 1024, int(fields["VmHWM"].split()[0]) * 1024

peak = [0]
stop = threading.Event()
def sample():
    while not stop.is_set():
        peak[0] = max(peak[0], anon()[0])
        time.sleep(0.002)

mode, root, source = sys.argv[1], sys.argv[2], sys.argv[3]
base = anon()[0]
thread = threading.Thread(target=sample, daemon=True)
thread.start()
with ArrayStore(os.path.join(root, "store-" + mode)) as store:
    if mode == "import":
        store.import_(source)
    elif mode == "export":
        store.import_(source)
        peak[0] = base = anon()[0]
        store.export(os.path.join(root, "out-" + os.path.basename(source)))
    elif mode == "pack":
        store.import_(source)
        peak[0] = base = anon()[0]
        store.pack(os.path.join(root, "store.lxpack"))
        packed = os.path.join(root, "store.lxpack")
        ArrayStore.unpack(packed, os.path.join(root, "unpacked")).close()
stop.set()
thread.join()
print((peak[0] - base) >> 20, anon()[1] >> 20)
"""

WRITER = r"""
import sys
import numpy as np
format, path, rows, width = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
step = max(1, (16 << 20) // (4 * width))
def chunks():
    for start in range(0, rows, step):
        count = min(step, rows - start)
        first, end = start * width, (start + count) * width
        yield np.arange(first, end, dtype=np.float32).reshape(count, width)
if format in ("npy", "npz", "safetensors", "hdf5", "zarr", "parquet", "feather", "csv"):
    # The loaderx exporters stream: build the file through a store filled chunk by chunk.
    import os, tempfile
    from loaderx import ArrayStore
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as scratch:
        with ArrayStore(os.path.join(scratch, "s")) as store:
            first = True
            for chunk in chunks():
                if format == "csv":
                    chunk = chunk.reshape(-1)
                if first:
                    store.save({"x": chunk}); first = False
                else:
                    store.append({"x": chunk})
            store.export(path)
elif format == "pt":
    import torch
    torch.save({"x": torch.from_numpy(np.concatenate(list(chunks())))}, path)
"""


def run(code: str, *args: str) -> str:
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [sys.executable, "-c", code, *args], env=env, capture_output=True, text=True, timeout=900
    )
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return done.stdout.strip()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mib", type=int, default=512, help="array size (csv: a quarter)")
    parser.add_argument("--formats", default=",".join(FORMATS))
    args = parser.parse_args()
    print("| format | array MiB | import: peak anon MiB | export | pack+unpack | VmHWM MiB |")
    print("|---|---|---|---|---|---|")
    for format in args.formats.split(","):
        mib = args.mib // 4 if format == "csv" else args.mib
        width = 1 if format == "csv" else 256
        rows = (mib << 20) // (4 * width)
        with tempfile.TemporaryDirectory() as root:
            source = os.path.join(root, f"source.{SUFFIX.get(format, format)}")
            run(WRITER, format, source, str(rows), str(width))
            results = [run(CHILD, mode, root, source).split() for mode in ("import", "export")]
            packed = run(CHILD, "pack", root, source).split() if format == "npy" else ["-", ""]
            results.append(packed)
            hwm = max(int(r[1]) for r in results if r[1])
            print(
                f"| {format} | {mib} | {results[0][0]} | {results[1][0]} | {results[2][0]} "
                f"| {hwm} |"
            )


if __name__ == "__main__":
    main()
