"""Data-parallel training with JAX multi-process: each process reads its shard.

Start one process per host (here: two on localhost, CPU):

    python examples/jax_train.py --data /tmp/jax_data --coordinator localhost:12355 --num-processes 2 --process-id 0 &
    python examples/jax_train.py --data /tmp/jax_data --coordinator localhost:12355 --num-processes 2 --process-id 1

``jax.distributed.initialize`` joins the processes; each builds
``DataLoader(..., shard=(jax.process_index(), jax.process_count()))`` and
reads only its slice of every global batch. A logistic regression takes one
gradient step per batch; the processes average their gradients with an
all-gather, so the run trains on the global batch. A checkpoint is the
weights and each process's ``loader.state_dict()``; ``--trace`` saves the
all-gathered sample ids, losses and final weights (tests/test_ddp.py).
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import multihost_utils

from loaderx import DataLoader, DenseDataset
from toy_data import FEATURES, make_data  # examples/toy_data.py

MODES = {"sequential": 0, "iid": 1, "cyclic": 2}
LEARNING_RATE = 0.5


def loss_fn(weights, x, y):
    """Mean logistic loss; ``weights`` is FEATURES coefficients then a bias."""
    logits = x @ weights[:-1] + weights[-1]
    return jnp.mean(jnp.logaddexp(0.0, logits) - y * logits)


loss_and_grad = jax.jit(jax.value_and_grad(loss_fn))


def initial_weights() -> np.ndarray:
    return np.zeros(FEATURES + 1, np.float32)


def checkpoint_file(directory: str, process: int) -> str:
    return os.path.join(directory, f"process{process}.npz")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dataset directory (created with toy data if missing)")
    parser.add_argument("--coordinator", required=True, help="host:port of process 0")
    parser.add_argument("--num-processes", type=int, required=True)
    parser.add_argument("--process-id", type=int, required=True)
    parser.add_argument("--rows", type=int, default=960)
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--batch-size", type=int, default=24, help="per process")
    parser.add_argument("--mode", choices=sorted(MODES), default="cyclic")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--save-at", type=int, default=None, help="write a checkpoint after this many steps")
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (one file per process)")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--trace", default=None, help="process 0 saves the gathered ids, losses and weights here (.npz)")
    args = parser.parse_args()

    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # cross-process collectives on CPU
    jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes, process_id=args.process_id)
    process, count = jax.process_index(), jax.process_count()
    if process == 0 and not os.path.exists(os.path.join(args.data, "id")):
        make_data(args.data, args.rows)
    multihost_utils.sync_global_devices("data written")

    streams = {name: DenseDataset(os.path.join(args.data, name)) for name in ("x", "y", "id")}
    loader = DataLoader(streams, batch_size=args.batch_size, mode=MODES[args.mode], seed=args.seed,
                        shard=(process, count), num_workers=2)
    weights = initial_weights()
    if args.resume:
        with np.load(checkpoint_file(args.checkpoint, process)) as saved:
            weights = saved["weights"]
            loader.load_state_dict(json.loads(str(saved["loader"])))
    start = loader.step
    ids, losses = [], []
    for step in range(start, args.steps):
        batch = next(loader)
        loss, gradient = loss_and_grad(weights, batch["x"], batch["y"].astype(np.float32))
        # Equal shards, so the mean of the processes' mean gradients is the global batch's.
        gradient = multihost_utils.process_allgather(np.asarray(gradient)).mean(axis=0)
        weights = (weights - LEARNING_RATE * gradient).astype(np.float32)
        if args.trace:
            ids.append(multihost_utils.process_allgather(batch["id"]).reshape(-1))
            losses.append(float(multihost_utils.process_allgather(np.asarray(loss)).mean()))
        if args.save_at is not None and step + 1 == args.save_at:
            os.makedirs(args.checkpoint, exist_ok=True)
            np.savez(checkpoint_file(args.checkpoint, process), weights=weights, loader=json.dumps(loader.state_dict()))
    loader.close()
    if process == 0 and args.trace:
        np.savez(args.trace, steps=np.arange(start, args.steps), ids=np.stack(ids), losses=np.array(losses), weights=weights)
    if process == 0 and losses:
        print(f"{count} processes: steps {start}..{args.steps - 1}, loss {losses[0]:.4f} -> {losses[-1]:.4f}")
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
