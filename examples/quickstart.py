"""loaderx quick start: convert NumPy arrays to stores, then train from them.

Run from anywhere: python examples/quickstart.py
It writes a few MiB into a temporary directory and removes it at the end.
"""

import shutil
import tempfile
from pathlib import Path

import numpy as np

from loaderx import DataLoader, DenseDataset, from_numpy

workdir = Path(tempfile.mkdtemp(prefix="loaderx-quickstart-"))
try:
    # A toy dataset: 10,000 images of 32x32x3 and their labels, as .npy files.
    rng = np.random.default_rng(0)
    np.save(workdir / "data.npy", rng.integers(0, 255, (10_000, 32, 32, 3), dtype=np.uint8))
    np.save(workdir / "label.npy", rng.integers(0, 10, 10_000).astype(np.int64))

    # Convert once: one record per row, streamed in bounded chunks from the mmap.
    from_numpy(workdir / "train_data", np.load(workdir / "data.npy", mmap_mode="r"))
    from_numpy(workdir / "train_label", np.load(workdir / "label.npy", mmap_mode="r"), codec="raw")

    # Train: an endless, step-based loader; batch k is the same on every run.
    loader = DataLoader(
        {"data": DenseDataset(workdir / "train_data"), "label": DenseDataset(workdir / "train_label")},
        batch_size=256,
        transform=lambda batch: batch,
    )
    with loader:
        for step, batch in enumerate(loader):
            if step >= 256:
                break
        state = loader.state_dict()  # save this with your checkpoint

    print("data batch:", batch["data"].shape, batch["data"].dtype)
    print("label batch:", batch["label"].shape, batch["label"].dtype)
    print("resume state:", state)
finally:
    shutil.rmtree(workdir)
