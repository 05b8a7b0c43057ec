"""examples/ddp_train.py under torchrun (2 ranks, CPU, gloo) and
examples/jax_train.py as 2 JAX processes (jax.distributed on localhost):
sharded loaders give the single-process global batches, cover every index
once per cycle, resume exactly, and train like one process."""

import importlib
import importlib.util
import os
import socket
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


EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
ROWS, BATCH, WORLD, STEPS, SAVE_AT, SEED = 960, 24, 2, 40, 25, 7  # 20 steps per CYCLIC cycle


def environment(root: Path) -> dict:
    """One thread per process, temporary files (torchrun's log directories)
    under the test's own directory, and Python's fault handler on, so that a
    rank killed by a signal prints where each of its threads was."""
    return dict(os.environ, OMP_NUM_THREADS="1", TMPDIR=str(root), PYTHONFAULTHANDLER="1")


def common_arguments() -> list:
    return [
        "--rows",
        str(ROWS),
        "--batch-size",
        str(BATCH),
        "--steps",
        str(STEPS),
        "--seed",
        str(SEED),
        "--mode",
        "cyclic",
    ]


def torchrun(root: Path, *args: str) -> str:
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={WORLD}",
        str(EXAMPLES / "ddp_train.py"),
        *common_arguments(),
        *args,
    ]
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=600, env=environment(root)
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def jax_processes(root: Path, *args: str) -> str:
    """WORLD processes of examples/jax_train.py joined through a coordinator on localhost."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(EXAMPLES / "jax_train.py"),
                "--coordinator",
                f"127.0.0.1:{port}",
                "--num-processes",
                str(WORLD),
                "--process-id",
                str(process),
                *common_arguments(),
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=environment(root),
        )
        for process in range(WORLD)
    ]
    outputs = []
    try:
        for process in processes:
            outputs.append(process.communicate(timeout=600)[0])
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    for process, output in zip(processes, outputs):
        assert process.returncode == 0, output
    return outputs[0]


LAUNCHERS = {"torch": torchrun, "jax": jax_processes}


@pytest.fixture(scope="module", params=sorted(LAUNCHERS))
def runs(request, tmp_path_factory):
    """Per engine: one full run that checkpoints at step SAVE_AT, and one resumed from it."""
    engine = request.param
    _require(engine)
    launch = LAUNCHERS[engine]
    root = tmp_path_factory.mktemp(engine)
    data, checkpoint = str(root / "data"), str(root / "checkpoint")
    full = launch(
        root,
        "--data",
        data,
        "--save-at",
        str(SAVE_AT),
        "--checkpoint",
        checkpoint,
        "--trace",
        str(root / "full.npz"),
    )
    resumed = launch(
        root,
        "--data",
        data,
        "--checkpoint",
        checkpoint,
        "--resume",
        "--trace",
        str(root / "resumed.npz"),
    )
    print(full, resumed)
    return engine, data, np.load(root / "full.npz"), np.load(root / "resumed.npz")


def test_rank_batches_concatenated_are_the_single_process_batches(runs):
    """At every step the all-gathered rank batches, in rank order, equal the
    batch of one unsharded DataLoader with the global batch size."""
    _, data, full, _ = runs
    assert full["ids"].shape == (STEPS, BATCH * WORLD)
    streams = {"id": DenseDataset(os.path.join(data, "id"))}
    with DataLoader(streams, batch_size=BATCH * WORLD, mode=2, seed=SEED, num_workers=1) as single:
        for step in range(STEPS):
            np.testing.assert_array_equal(
                full["ids"][step], next(single)["id"], err_msg=f"step {step}"
            )
    streams["id"].close()


def test_ranks_together_see_every_index_once_per_cycle(runs):
    """CYCLIC: the 20 steps of each cycle hold every index exactly once, across both ranks."""
    _, _, full, _ = runs
    steps_per_cycle = ROWS // (BATCH * WORLD)
    for cycle in range(STEPS // steps_per_cycle):
        seen = full["ids"][cycle * steps_per_cycle : (cycle + 1) * steps_per_cycle].reshape(-1)
        np.testing.assert_array_equal(np.sort(seen), np.arange(ROWS), err_msg=f"cycle {cycle}")
    assert not np.array_equal(
        full["ids"][:steps_per_cycle], full["ids"][steps_per_cycle : 2 * steps_per_cycle]
    )


def test_checkpoint_resume_on_both_ranks_continues_exactly(runs):
    """The resumed run reads the same batches, reaches the same losses and
    ends with bit-identical weights as the uninterrupted run."""
    _, _, full, resumed = runs
    np.testing.assert_array_equal(resumed["steps"], np.arange(SAVE_AT, STEPS))
    np.testing.assert_array_equal(resumed["ids"], full["ids"][SAVE_AT:])
    np.testing.assert_array_equal(resumed["losses"], full["losses"][SAVE_AT:])
    np.testing.assert_array_equal(resumed["weights"], full["weights"])


def example(name: str):
    """An example script as a module (they import examples/toy_data.py)."""
    if str(EXAMPLES) not in sys.path:
        sys.path.insert(0, str(EXAMPLES))
    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def train_on_global_batches(engine: str, data: str):
    """One process trains the example's model on the unsharded global batches;
    returns its losses and final weights."""
    streams = {name: DenseDataset(os.path.join(data, name)) for name in ("x", "y")}
    loader = DataLoader(streams, batch_size=BATCH * WORLD, mode=2, seed=SEED, num_workers=1)
    batches = [next(loader) for _ in range(STEPS)]
    loader.close()
    for dataset in streams.values():
        dataset.close()
    losses = []
    if engine == "torch":
        torch = _require("torch")
        model, optimizer = example("ddp_train").model_and_optimizer()
        for batch in batches:
            loss = torch.nn.functional.cross_entropy(
                model(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"])
            )
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, torch.cat(
            [parameter.detach().reshape(-1) for parameter in model.parameters()]
        ).numpy()
    module = example("jax_train")
    weights = module.initial_weights()
    for batch in batches:
        loss, gradient = module.loss_and_grad(weights, batch["x"], batch["y"].astype(np.float32))
        weights = (weights - module.LEARNING_RATE * np.asarray(gradient)).astype(np.float32)
        losses.append(float(loss))
    return losses, weights


def test_the_ranks_train_like_one_process_on_the_global_batch(runs):
    """Data-parallel training on the sharded loaders is the same training as one
    process reading the global batches: same losses and weights, up to float
    rounding."""
    engine, data, full, _ = runs
    losses, weights = train_on_global_batches(engine, data)
    np.testing.assert_allclose(full["losses"], losses, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(full["weights"], weights, rtol=1e-4, atol=1e-5)
    assert losses[-1] < 0.8 * losses[0]  # it learns


def test_resume_on_another_world_size_continues_the_global_stream(tmp_path):
    """As the README says: 2 ranks of 24 checkpoint at step 7; 4 ranks of 12,
    each loading the state with its own shard and batch size filled in, read
    the global batches 7.. of one process with batch 48."""
    from loaderx import from_numpy

    from_numpy(tmp_path / "id", np.arange(ROWS, dtype=np.int64))
    dataset = DenseDataset(tmp_path / "id")
    with DataLoader(
        {"id": dataset}, batch_size=24, mode=2, seed=SEED, shard=(1, 2), num_workers=1
    ) as old:
        for _ in range(7):
            next(old)
        old_state = old.state_dict()
    resumed = []
    for rank in range(4):
        with DataLoader(
            {"id": dataset}, batch_size=12, mode=2, seed=SEED, shard=(rank, 4), num_workers=1
        ) as loader:
            loader.load_state_dict({**old_state, "shard": [rank, 4], "batch_size": 12})
            resumed.append([next(loader)["id"] for _ in range(5)])
    with DataLoader({"id": dataset}, batch_size=48, mode=2, seed=SEED, num_workers=1) as single:
        expected = [next(single)["id"] for _ in range(12)][7:]
    for step in range(5):
        np.testing.assert_array_equal(
            np.concatenate([resumed[rank][step] for rank in range(4)]), expected[step]
        )
    dataset.close()
