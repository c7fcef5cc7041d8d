"""tp_fsdp -- the same small Llama trained through three APIs: native FSDP2, Hugging Face Accelerate, Lightning Fabric.

Each API gets its training loop written once, the way its documentation writes it (``train_native``,
``train_accelerate``, ``train_fabric``): same model (``dlo.models.llama.Llama``, same seed), same data (one
fixed set of token sequences, each step one global batch of them), same optimizer (AdamW), fp32. The only
lines that are not the API's own are the ``meter`` calls, which record the loss, the step time and the bytes
each rank holds (``dlo.lessons.apis.StepMeter``). Every rank writes one record (``dlo.runtime.write_record``).

Run it (2 processes):
    torchrun --nproc-per-node 2 apis_train.py --api native --strategy fsdp
    torchrun --nproc-per-node 2 apis_train.py --api fabric --strategy ddp
    accelerate launch --config_file accelerate_fsdp.yaml apis_train.py --api accelerate --strategy fsdp
and from the notebook: ``dlo.runtime.launch`` (torchrun) and ``dlo.lessons.apis.launch_accelerate``.

Accelerate and Lightning Fabric are imported inside their functions: ``--api native`` needs torch alone.
"""
from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from dlo.lessons import apis
from dlo.models.llama import DecoderBlock, Llama, lm_loss, token_batch
from dlo.runtime import exit_after_success, write_record


def dataset(cfg, args) -> TensorDataset:
    """``steps × global_batch`` fixed token sequences: step ``k`` trains on sequences ``k·B .. (k+1)·B - 1``."""
    ids, labels = token_batch(args.steps * args.global_batch, args.seq_len, cfg.vocab_size, seed=args.seed)
    return TensorDataset(ids, labels)


# ---------------------------------------------------------------------------------------------------
# 1. Native PyTorch: process group, device, wrapping, sampler, loop: all yours
# ---------------------------------------------------------------------------------------------------
def train_native(args, cfg, new_meter):
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    world = dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    model = Llama(cfg, seed=args.seed).to(device)
    if args.strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard
        for layer in model.layers:
            fully_shard(layer)
        fully_shard(model)
    else:
        from torch.nn.parallel import DistributedDataParallel as DDP
        model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = dataset(cfg, args)
    loader = DataLoader(data, batch_size=args.global_batch // world, sampler=DistributedSampler(data, shuffle=False))
    meter = new_meter(device)
    for ids, labels in loader:
        ids, labels = ids.to(device), labels.to(device)
        loss = lm_loss(model(ids), labels)
        loss.backward()
        optimizer.step()
        meter.step(loss, model, optimizer)
        optimizer.zero_grad()
    return model, None, meter


# ---------------------------------------------------------------------------------------------------
# 2. Hugging Face Accelerate: the strategy lives in the YAML config of `accelerate launch`
# ---------------------------------------------------------------------------------------------------
def train_accelerate(args, cfg, new_meter):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=not torch.cuda.is_available())
    model = Llama(cfg, seed=args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    loader = DataLoader(dataset(cfg, args), batch_size=args.global_batch // accelerator.num_processes)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    meter = new_meter(accelerator.device)
    for ids, labels in loader:
        loss = lm_loss(model(ids), labels)
        accelerator.backward(loss)
        optimizer.step()
        meter.step(loss, model, optimizer)
        optimizer.zero_grad()
    return model, accelerator, meter


# ---------------------------------------------------------------------------------------------------
# 3. Lightning Fabric: the strategy is an argument; FSDP2 is its ModelParallelStrategy
# ---------------------------------------------------------------------------------------------------
def train_fabric(args, cfg, new_meter):
    from lightning_fabric import Fabric
    from lightning_fabric.strategies import ModelParallelStrategy
    from torch.distributed.fsdp import fully_shard

    def shard(model, mesh):
        for layer in model.layers:
            fully_shard(layer, mesh=mesh["data_parallel"])
        return fully_shard(model, mesh=mesh["data_parallel"])

    devices = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    strategy = ModelParallelStrategy(shard, data_parallel_size=devices, tensor_parallel_size=1) \
        if args.strategy == "fsdp" else "ddp"
    fabric = Fabric(accelerator="cuda" if torch.cuda.is_available() else "cpu", devices=devices, strategy=strategy)
    fabric.launch()
    model = fabric.setup_module(Llama(cfg, seed=args.seed))
    optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters(), lr=args.lr))
    loader = fabric.setup_dataloaders(DataLoader(dataset(cfg, args), batch_size=args.global_batch // fabric.world_size))
    meter = new_meter(fabric.device)
    for ids, labels in loader:
        loss = lm_loss(model(ids), labels)
        fabric.backward(loss)
        optimizer.step()
        meter.step(loss, model, optimizer)
        optimizer.zero_grad()
    return model, fabric, meter


TRAIN = {"native": train_native, "accelerate": train_accelerate, "fabric": train_fabric}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--api", required=True, choices=list(apis.API_STRATEGIES))
    p.add_argument("--strategy", default="fsdp", choices=sorted({s for v in apis.API_STRATEGIES.values() for s in v}))
    p.add_argument("--model", default="smoke", choices=list(apis.MODELS))
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--global-batch", type=int, default=4, help="sequences per optimizer step, over all ranks")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup-steps", type=int, default=2, help="first steps left out of the timing")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    reason = apis.unavailable_reason(args.api, args.strategy, device_type)
    if reason:
        raise SystemExit(reason)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} does not split over {world} processes")
    cfg = apis.MODELS[args.model]
    tokens = args.global_batch * args.seq_len

    def new_meter(device):  # started: the first interval is the first step
        meter = apis.StepMeter(device, tokens_per_step=tokens, warmup=args.warmup_steps)
        meter.start()
        return meter

    model, handle, meter = TRAIN[args.api](args, cfg, new_meter)
    resolved = apis.resolved_config(args.api, args.strategy, model, handle)
    if world > 1 and resolved.get("num_processes", world) != world:
        raise SystemExit(f"{args.api} resolved {resolved['num_processes']} process(es) for a launch of {world}: "
                         f"each rank would train alone ({resolved['summary']})")
    name = f"{args.api} {args.strategy}"
    write_record({"run": name, "api": args.api, "strategy": args.strategy, "model": args.model,
                  "n_layers": cfg.num_layers, "block": DecoderBlock.__name__, "seq_len": args.seq_len,
                  "global_batch": args.global_batch, "resolved": resolved, **meter.record(name)})
    rank = dist.get_rank() if dist.is_initialized() else 0
    if rank == 0:
        print(f"[{name}] resolved: {resolved['summary']}; loss {meter.losses[0]:.4f} -> {meter.losses[-1]:.4f} "
              f"(rank 0), params held per rank {meter.bytes['params']:,} B", flush=True)
    if dist.is_initialized():
        dist.barrier()  # past it, no peer waits for this rank: it may leave without tearing its groups down


if __name__ == "__main__":
    main()
    # leave without Python's finalizers: a rank was seen hanging at exit in the destruction of the gloo group that
    # Fabric or Accelerate holds, after its record was written and every rank had passed the barrier
    exit_after_success(keep_group=True)
