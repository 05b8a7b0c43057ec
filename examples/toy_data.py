"""The toy dataset of the distributed examples: a separable binary problem."""

import os

import numpy as np

from loaderx import from_numpy

FEATURES = 16


def make_data(path: str, rows: int) -> None:
    """Stores x (16 float32 features), y (a binary label) and each row's id."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    y = (x @ rng.standard_normal(FEATURES) > 0).astype(np.int64)
    for name, array in (("x", x), ("y", y), ("id", np.arange(rows, dtype=np.int64))):
        from_numpy(os.path.join(path, name), array, progress=False)
