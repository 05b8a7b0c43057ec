"""examples/ddp_train.py under torchrun (2 ranks, CPU, gloo): sharded loaders
give the single-process global batches, cover every index once per cycle, and
resume exactly."""

import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from loaderx import DataLoader, DenseDataset


def _require(name: str):
    """The module; CI installs the [torch] extra, so there a missing one fails."""
    if os.environ.get("CI"):
        return importlib.import_module(name)
    return pytest.importorskip(name)


torch = _require("torch")

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "ddp_train.py"
ROWS, BATCH, WORLD, STEPS, SAVE_AT, SEED = 960, 24, 2, 40, 25, 7  # 20 steps per CYCLIC cycle


def torchrun(*args: str) -> str:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={WORLD}", str(EXAMPLE),
               "--rows", str(ROWS), "--batch-size", str(BATCH), "--steps", str(STEPS), "--seed", str(SEED), *args]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One full run that checkpoints at step SAVE_AT, and one resumed from it."""
    root = tmp_path_factory.mktemp("ddp")
    data, checkpoint = str(root / "data"), str(root / "checkpoint")
    full = torchrun("--data", data, "--mode", "cyclic", "--save-at", str(SAVE_AT), "--checkpoint", checkpoint, "--trace", str(root / "full.npz"))
    resumed = torchrun("--data", data, "--mode", "cyclic", "--checkpoint", checkpoint, "--resume", "--trace", str(root / "resumed.npz"))
    print(full, resumed)
    return data, np.load(root / "full.npz"), np.load(root / "resumed.npz")


def test_rank_batches_concatenated_are_the_single_process_batches(runs):
    """At every step the all-gathered rank batches, in rank order, equal the
    batch of one unsharded DataLoader with the global batch size."""
    data, full, _ = runs
    assert full["ids"].shape == (STEPS, BATCH * WORLD)
    streams = {"id": DenseDataset(os.path.join(data, "id"))}
    with DataLoader(streams, batch_size=BATCH * WORLD, mode=2, seed=SEED, num_workers=1) as single:
        for step in range(STEPS):
            np.testing.assert_array_equal(full["ids"][step], next(single)["id"], err_msg=f"step {step}")
    streams["id"].close()


def test_ranks_together_see_every_index_once_per_cycle(runs):
    """CYCLIC: the 20 steps of each cycle hold every index exactly once, across both ranks."""
    _, full, _ = runs
    steps_per_cycle = ROWS // (BATCH * WORLD)
    for cycle in range(STEPS // steps_per_cycle):
        seen = full["ids"][cycle * steps_per_cycle : (cycle + 1) * steps_per_cycle].reshape(-1)
        np.testing.assert_array_equal(np.sort(seen), np.arange(ROWS), err_msg=f"cycle {cycle}")
    assert not np.array_equal(full["ids"][:steps_per_cycle], full["ids"][steps_per_cycle:2 * steps_per_cycle])


def test_checkpoint_resume_on_both_ranks_continues_exactly(runs):
    """The resumed run reads the same batches, reaches the same losses and
    ends with bit-identical weights as the uninterrupted run."""
    _, full, resumed = runs
    np.testing.assert_array_equal(resumed["steps"], np.arange(SAVE_AT, STEPS))
    np.testing.assert_array_equal(resumed["ids"], full["ids"][SAVE_AT:])
    np.testing.assert_array_equal(resumed["losses"], full["losses"][SAVE_AT:])
    np.testing.assert_array_equal(resumed["weights"], full["weights"])


def test_two_ranks_train_like_one_process_on_the_global_batch(runs):
    """DDP on the sharded loaders is the same training as one process reading
    the global batches: same losses and weights, up to float rounding."""
    data, full, _ = runs
    spec = importlib.util.spec_from_file_location("ddp_train", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    model, optimizer = example.model_and_optimizer()
    streams = {name: DenseDataset(os.path.join(data, name)) for name in ("x", "y")}
    losses = []
    with DataLoader(streams, batch_size=BATCH * WORLD, mode=2, seed=SEED, num_workers=1) as single:
        for _ in range(STEPS):
            batch = next(single)
            loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
    for dataset in streams.values():
        dataset.close()
    weights = torch.cat([parameter.detach().reshape(-1) for parameter in model.parameters()]).numpy()
    np.testing.assert_allclose(full["losses"], losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(full["weights"], weights, rtol=1e-4, atol=1e-5)
    assert losses[-1] < 0.8 * losses[0]  # it learns
