"""Data-parallel training with torch.distributed: each rank reads its shard.

    torchrun --nproc_per_node=2 examples/ddp_train.py --data /tmp/ddp_data --steps 40

Every rank builds ``DataLoader(..., shard=(rank, world_size))`` with the same
seed and mode and reads only its slice of each global batch, with no
communication: at step k the ranks' batches, concatenated in rank order, are
exactly the batch of size ``batch_size * world_size`` a single process would
read. The model is wrapped in DistributedDataParallel (CPU, gloo), which
averages the gradients, so the run trains on the global batch.

A checkpoint is the model, the optimizer and each rank's
``loader.state_dict()``; ``--resume`` continues with exactly the batch that
would have come next. ``--trace FILE`` makes rank 0 all-gather the sample ids
of every step and save them with the losses and final weights
(tests/test_ddp.py checks them).
"""

from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from loaderx import DataLoader, DenseDataset
from toy_data import FEATURES, make_data  # examples/toy_data.py

MODES = {"sequential": 0, "iid": 1, "cyclic": 2}


def model_and_optimizer():
    torch.manual_seed(0)  # the same initial weights everywhere (DDP also broadcasts rank 0's)
    model = nn.Sequential(nn.Linear(FEATURES, 32), nn.ReLU(), nn.Linear(32, 2))
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def checkpoint_file(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank{rank}.pt")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True, help="dataset directory (created with toy data if missing)")
    parser.add_argument("--rows", type=int, default=960)
    parser.add_argument("--steps", type=int, default=40, help="train until this step")
    parser.add_argument("--batch-size", type=int, default=24, help="per rank")
    parser.add_argument("--mode", choices=sorted(MODES), default="cyclic")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--save-at", type=int, default=None, help="write a checkpoint after this many steps")
    parser.add_argument("--checkpoint", default=None, help="checkpoint directory (one file per rank)")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--trace", default=None, help="rank 0 saves the gathered ids, losses and weights here (.npz)")
    args = parser.parse_args()

    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if rank == 0 and not os.path.exists(os.path.join(args.data, "id")):
        make_data(args.data, args.rows)
    dist.barrier()  # the data exists before any rank opens it

    streams = {name: DenseDataset(os.path.join(args.data, name)) for name in ("x", "y", "id")}
    loader = DataLoader(streams, batch_size=args.batch_size, mode=MODES[args.mode], seed=args.seed,
                        shard=(rank, world_size), num_workers=2)
    model, optimizer = model_and_optimizer()
    if args.resume:
        state = torch.load(checkpoint_file(args.checkpoint, rank), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
    ddp = DistributedDataParallel(model)
    start = loader.step
    gathered = [torch.empty(args.batch_size, dtype=torch.int64) for _ in range(world_size)]
    ids, losses, first_loss = [], [], None
    for step in range(start, args.steps):
        batch = next(loader)
        loss = nn.functional.cross_entropy(ddp(torch.from_numpy(batch["x"])), torch.from_numpy(batch["y"]))
        first_loss = loss.item() if step == start else first_loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if args.trace:
            dist.all_gather(gathered, torch.from_numpy(batch["id"]))
            ids.append(torch.cat(gathered).numpy())
            total = loss.detach().clone()
            dist.all_reduce(total)  # the global batch's mean loss
            losses.append(total.item() / world_size)
        if args.save_at is not None and step + 1 == args.save_at:
            os.makedirs(args.checkpoint, exist_ok=True)
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
            torch.save(state, checkpoint_file(args.checkpoint, rank))
    loader.close()
    if rank == 0 and start < args.steps:
        print(f"world_size={world_size}: steps {start}..{args.steps - 1}, rank 0's loss {first_loss:.4f} -> {loss.item():.4f}")
        if args.trace:
            weights = torch.cat([parameter.detach().reshape(-1) for parameter in model.parameters()]).numpy()
            np.savez(args.trace, steps=np.arange(start, args.steps), ids=np.stack(ids), losses=np.array(losses), weights=weights)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
