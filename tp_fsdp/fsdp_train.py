"""tp_fsdp -- training Llama 3.2 3B past DDP's memory wall: FSDP2, mixed precision, checkpointing, DeepSpeed ZeRO.

DDP keeps everything (weights, gradients, AdamW states: 16 bytes per parameter, 51 GB for 3.2 B parameters)
on every GPU. FSDP2 shards all three over the ranks and all-gathers one decoder layer at a time. This script
trains transformers' LlamaForCausalLM (exact Llama 3.2 3B config, or a small one) on token data from
``dlo.data.tokens`` under one of several configurations, and writes one record per configuration and rank:
tokens/s, MFU and HFU, peak memory, the memory the calculator (``dlo.measure.memory``) predicts, the loss trajectory.

The levers of a fast step are options too (each one also a key of a ``--runs`` entry): ``--optimizer-impl``
(AdamW for-loop / foreach / fused), ``--grad-accum N`` (``--accum-sync``, ``--accum-keep-gathered``),
``--checkpointing {none,full,selective}`` with ``--ac-every k``, ``--loss chunked`` (the 128 k-vocabulary
logits never held at once); each record says which SDPA kernel ran (``sdpa_backends``).

Run it:
    python fsdp_train.py --model smoke --steps 6                        # one process
    torchrun --nproc_per_node 2 fsdp_train.py --model smoke --strategy fsdp
    torchrun --nproc_per_node 2 fsdp_train.py --runs '[{"compute_only": true}, {"prefetch": "none"}]' --timed-repeats 7
    dlo.runtime.launch("fsdp_train.py", [..., "--runs", json.dumps([...])], nproc=2)   # what the notebook does

Exercises 0-8 are the functions with a TODO in ``student/fsdp_train.py``; ``dlo check fsdp <step>`` checks one.
"""
from __future__ import annotations

import argparse
import gc
import importlib.util
import shutil
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import dlo  # noqa: F401  (caches and torchvision shim, before transformers)
from dlo.data import tokens
from dlo.runtime.arguments import ScriptParser, at_least
from dlo.runtime import exit_after_success, expand_runs, init_distributed, pick_device, teardown, write_record
from dlo.measure import bench
from dlo.measure.memory import GB, count_parameters, fsdp2_peak_memory, per_gpu_memory
from dlo.parallel import agreed_timer
from dlo.parallel import fsdp as ref


# ---------------------------------------------------------------------------------------------------
# Exercise 0 -- the baseline: DDP
# ---------------------------------------------------------------------------------------------------
def wrap_ddp(model: nn.Module, ctx, device: torch.device) -> nn.Module:
    """The model on ``device``; with several processes, replicated by DDP (which takes device ids on GPUs
    only). With one process there is no process group: the model itself."""
    # BEGIN SOLUTION: model.to(device); return it alone when not ctx.is_distributed, else DDP(model, device_ids=...)
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = model.to(device)
    if not ctx.is_distributed:
        return model
    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 1 (and 4) -- FSDP2: each decoder layer, then the root
# ---------------------------------------------------------------------------------------------------
def apply_fsdp(model: nn.Module, *, mp_policy=None, reshard_after_forward: bool = True, offload=None) -> nn.Module:
    """``fully_shard`` every decoder layer (``model.model.layers``), then the whole model.

    Each call makes one FSDP unit: its parameters are all-gathered together before it runs and its gradients
    reduce-scattered together after its backward. The root call takes what no layer owns (embeddings,
    final norm, the tied head). Pass ``mp_policy`` (None: fp32), ``reshard_after_forward`` and ``offload``
    (an OffloadPolicy, None: none) to every call.
    """
    # BEGIN SOLUTION: from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy, OffloadPolicy; fully_shard(layer, ...) for each layer, then fully_shard(model, ...)
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, fully_shard

    kwargs = dict(mp_policy=mp_policy or MixedPrecisionPolicy(), offload_policy=offload or OffloadPolicy(),
                  reshard_after_forward=reshard_after_forward)
    for layer in model.model.layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    return model
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 2 -- mixed precision
# ---------------------------------------------------------------------------------------------------
def mixed_precision_policy(precision: str):
    """None for ``"fp32"``; for ``"bf16"`` a ``MixedPrecisionPolicy`` computing in bf16 (the all-gathered
    weights) but reducing gradients in fp32. Any other name: ValueError."""
    # BEGIN SOLUTION: None for "fp32"; MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) for "bf16"; else ValueError
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision == "fp32":
        return None
    if precision == "bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    raise ValueError(f"unknown precision {precision!r}: use 'fp32' or 'bf16'")
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 3 -- activation checkpointing
# ---------------------------------------------------------------------------------------------------
def apply_activation_checkpointing(model: nn.Module) -> nn.Module:
    """Make every decoder layer recompute its activations during backward instead of storing them (torch's
    checkpoint wrapper, in ``torch.distributed.algorithms._checkpoint``), inside the model itself. Call it before
    ``apply_fsdp``; return the model."""
    # BEGIN SOLUTION: for i, layer in enumerate(model.model.layers): model.model.layers[i] = checkpoint_wrapper(layer)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    layers = model.model.layers
    for i, layer in enumerate(layers):
        layers[i] = checkpoint_wrapper(layer, preserve_rng_state=False)
    return model
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 5 -- CPU offload
# ---------------------------------------------------------------------------------------------------
def offload_policy(device: torch.device, enabled: bool):
    """``OffloadPolicy()`` (nothing offloaded) when not enabled; ``CPUOffloadPolicy(pin_memory=True)`` when
    enabled on a GPU; enabled while training on the CPU: ``ValueError`` saying why (nothing to offload)."""
    # BEGIN SOLUTION: OffloadPolicy() if not enabled; ValueError if device.type != "cuda"; else CPUOffloadPolicy(pin_memory=True)
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    if not enabled:
        return OffloadPolicy()
    if torch.device(device).type != "cuda":
        raise ValueError(f"CPU offload moves the sharded state from GPU to CPU memory, but this run trains on "
                         f"{device}: drop the offload option, or run on GPUs")
    return CPUOffloadPolicy(pin_memory=True)
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 6 -- torch.compile on the sharded model
# ---------------------------------------------------------------------------------------------------
def compile_layers(model: nn.Module) -> nn.Module:
    """Compile each decoder layer in place, before ``apply_fsdp``: the layers stay the same modules under the
    same names, FSDP's hooks stay between the compiled layers, and all layers share one compiled graph. Return
    the model."""
    # BEGIN SOLUTION: layer.compile() for every layer in model.model.layers
    for layer in model.model.layers:
        layer.compile()
    return model
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 7 -- sharded checkpoint, save and resume
# ---------------------------------------------------------------------------------------------------
def save_checkpoint(path, model: nn.Module, optimizer, step: int) -> None:
    """Every rank writes its own shards of the model's and the optimizer's state, with ``step``, as one
    distributed checkpoint (``torch.distributed.checkpoint``) in the folder ``path``."""
    # BEGIN SOLUTION: get_state_dict(model, optimizer), then dcp.save({...}, checkpoint_id=str(path))
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    dcp.save({"model": model_sd, "optim": optim_sd, "step": torch.tensor(step)}, checkpoint_id=str(path))
    # END SOLUTION


def load_checkpoint(path, model: nn.Module, optimizer) -> int:
    """Load what :func:`save_checkpoint` wrote into this (identically sharded) model and optimizer, in
    place; return the saved step. A distributed checkpoint loads into a state dict that already has the right
    shapes, which must then be applied to the model and the optimizer."""
    # BEGIN SOLUTION: state = {"model": ..., "optim": ..., "step": torch.tensor(0)} from get_state_dict; dcp.load(state, checkpoint_id=...); set_state_dict(...); return int(state["step"])
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd, "step": torch.tensor(0)}
    dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return int(state["step"])
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# Exercise 8 -- DeepSpeed ZeRO
# ---------------------------------------------------------------------------------------------------
def deepspeed_config(stage: int, global_batch: int, world_size: int, precision: str = "fp32") -> dict:
    """The DeepSpeed JSON config of ZeRO ``stage`` (1, 2 or 3): ``train_batch_size`` (global),
    ``train_micro_batch_size_per_gpu`` (per rank: ``dlo.data.tokens.per_rank_batch``), ``gradient_accumulation_steps``
    1, ``zero_optimization: {"stage": stage}``, ``bf16: {"enabled": precision == "bf16"}``."""
    # BEGIN SOLUTION: check the stage, then the dict described above (per_rank_batch raises when world_size does not divide)
    if stage not in (1, 2, 3):
        raise ValueError(f"ZeRO stage must be 1, 2 or 3, got {stage!r}")
    return {"train_batch_size": global_batch,
            "train_micro_batch_size_per_gpu": tokens.per_rank_batch(global_batch, world_size),
            "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
            "bf16": {"enabled": precision == "bf16"}, "steps_per_print": 10**9}
    # END SOLUTION


# ---------------------------------------------------------------------------------------------------
# The run itself (not an exercise)
# ---------------------------------------------------------------------------------------------------
STRATEGIES = ("ddp", "fsdp", "zero1", "zero2", "zero3")


def parse_args(argv=None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> ScriptParser:
    p = ScriptParser(prog=Path(__file__).name, description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smoke", choices=list(ref.MODEL_CONFIGS))
    p.add_argument("--model-path", default=None, help="local save_pretrained folder (default: random init)")
    p.add_argument("--data", default=None, help="datasets.save_to_disk folder or .txt file(s) (default: generated)")
    p.add_argument("--tokenizer", default=None, help="local tokenizer folder, needed with --data")
    p.add_argument("--seq-len", type=at_least(1), default=64)
    p.add_argument("--global-batch", type=at_least(1), default=4, help="sequences per optimizer step, over all ranks")
    p.add_argument("--steps", type=at_least(1), default=6)
    p.add_argument("--warmup-steps", type=at_least(0), default=2, help="first steps left out of the timing")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--seed", type=at_least(0), default=0)
    p.add_argument("--strategy", default="fsdp", choices=STRATEGIES)
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16"])
    p.add_argument("--checkpointing", nargs="?", const="full", default="none", choices=list(ref.AC_MODES),
                   help="activation checkpointing of decoder layers (alone: full; selective: op-level, keeps matmuls)")
    p.add_argument("--ac-every", type=at_least(1), default=1, help="checkpoint one decoder layer in k (0, k, 2k...)")
    p.add_argument("--optimizer-impl", default="default", choices=list(ref.OPTIMIZER_IMPLS),
                   help="AdamW: torch's default, foreach, or fused (one kernel)")
    p.add_argument("--grad-accum", type=at_least(1), default=1,
                   help="micro-batches per optimizer step: each rank's batch is split into this many")
    p.add_argument("--accum-sync", default="last", choices=list(ref.ACCUM_SYNC),
                   help="with --grad-accum: reduce gradients after the last micro-batch only, or after every one")
    p.add_argument("--accum-keep-gathered", action="store_true",
                   help="FSDP with --grad-accum: keep the gathered weights from one micro-batch to the next")
    p.add_argument("--loss", default="full", choices=list(ref.LOSS_MODES),
                   help="full: the tokens x vocab logits at once; chunked: head + cross-entropy chunk by chunk")
    p.add_argument("--loss-chunk-tokens", type=at_least(1), default=1024, help="--loss chunked: tokens per chunk")
    p.add_argument("--no-reshard", action="store_true", help="FSDP: keep gathered weights from forward to backward")
    p.add_argument("--offload", action="store_true", help="FSDP: CPU offload of the sharded state (GPU only)")
    p.add_argument("--compile", action="store_true", help="torch.compile each decoder layer")
    p.add_argument("--prefetch", default="default", choices=list(ref.PREFETCH_MODES),
                   help="FSDP: when each layer's all-gather is issued (dlo.parallel.fsdp.set_prefetch)")
    p.add_argument("--prefetch-depth", type=at_least(1), default=2, help="FSDP, --prefetch explicit: layers gathered ahead")
    p.add_argument("--compute-only", action="store_true",
                   help="the baseline of exposed communication: the unsharded model on every rank, no collective")
    p.add_argument("--timed-repeats", type=at_least(0), default=0,
                   help="after the training steps: warm up until steady, then time this many steps (0: none)")
    p.add_argument("--warmup-max-calls", type=at_least(1), default=10, help="cap on the warm-up steps of --timed-repeats")
    p.add_argument("--resume-check", action="store_true",
                   help="FSDP: train half, save a sharded checkpoint, reload it into a fresh model, finish, compare")
    p.add_argument("--runs", default=None,
                   help='JSON list of runs, each a dict of overrides, e.g. [{"name": "bf16", "precision": "bf16"}]')
    return p


def normalise(args) -> argparse.Namespace:
    """Values a ``--runs`` entry may give in another form: ``"checkpointing": true`` is ``"full"``."""
    args.checkpointing = ref.checkpoint_mode(args.checkpointing)
    ref.checkpointed_layers(1, args.checkpointing, args.ac_every)  # checks --ac-every
    if args.grad_accum < 1:
        raise ValueError(f"--grad-accum must be >= 1, got {args.grad_accum}")
    if args.grad_accum > 1 and args.strategy.startswith("zero"):
        raise ValueError("--grad-accum: DeepSpeed accumulates through its own config; use it with ddp or fsdp")
    return args


def why_skipped(args) -> str | None:
    """Why this run cannot start in this Python, in one line (None: it can). A GPU node may have torch without
    DeepSpeed: its ZeRO runs are then left out of the launch instead of failing it."""
    if args.strategy.startswith("zero") and importlib.util.find_spec("deepspeed") is None:
        return ("DeepSpeed is not installed in this Python (a GPU node may not have it: pip install deepspeed==0.19.8)"
                ": this run is left out")
    return None


def plan(args) -> tuple[list[tuple[str, argparse.Namespace]], list[dict]]:
    """The runs of this launch that can start, in order, and one record per run left out, with its reason."""
    runs, skipped = [], []
    for name, run_args in expand_runs(args, args.runs):
        reason = why_skipped(run_args)
        if reason is None:
            runs.append((name, run_args))
        else:
            skipped.append({"run": name, "strategy": run_args.strategy, "status": "skipped", "skipped": reason})
    return runs, skipped


def step_options(args) -> dict:
    """The keyword arguments of ``ref.train_step`` that the levers set."""
    return {"grad_accum": args.grad_accum, "accum_sync": args.accum_sync,
            "accum_keep_gathered": args.accum_keep_gathered}


def build(args, ctx, device, cfg):
    """The wrapped model, its optimizer and, for DeepSpeed, the engine."""
    if args.offload and args.strategy != "fsdp":
        raise ValueError(f"--offload is an FSDP option, not one of {args.strategy}")
    # errors before any work; only the runs that offload need exercise 5 written
    offload = offload_policy(device, True) if args.offload and args.strategy == "fsdp" else None
    if args.prefetch != "default" and (args.strategy != "fsdp" or args.compute_only):
        raise ValueError(f"--prefetch {args.prefetch} schedules FSDP's all-gathers: use it with --strategy fsdp only")
    if args.compute_only and (args.offload or args.resume_check or args.strategy.startswith("zero")):
        raise ValueError("--compute-only runs the plain model without any communication: no --offload, "
                         "--resume-check or DeepSpeed strategy with it")
    model = ref.build_llama(cfg, model_path=args.model_path, seed=args.seed, device=device)
    if args.loss == "chunked":
        ref.use_chunked_loss(model, args.loss_chunk_tokens)
    if args.checkpointing == "full" and args.ac_every == 1:
        apply_activation_checkpointing(model)
    elif args.checkpointing != "none":
        ref.apply_activation_checkpointing(model, args.checkpointing, every=args.ac_every)
    if args.compile:
        compile_layers(model)
    if args.compute_only:  # same model, same per-rank batches, nothing sharded, nothing communicated
        pass
    elif args.strategy == "ddp":
        model = wrap_ddp(model, ctx, device)
        if args.precision != "fp32":
            raise ValueError("this script runs DDP in fp32 only (the baseline); use --strategy fsdp for bf16")
    elif args.strategy == "fsdp":
        mp_policy = None if args.precision == "fp32" else mixed_precision_policy(args.precision)  # fp32: no exercise 2
        model = apply_fsdp(model, mp_policy=mp_policy,
                           reshard_after_forward=not args.no_reshard, offload=offload)
        ref.set_prefetch(model, args.prefetch, depth=args.prefetch_depth)
    optimizer = ref.build_optimizer(model.parameters(), lr=args.lr, impl=args.optimizer_impl)
    engine = None
    if args.strategy.startswith("zero"):
        config = deepspeed_config(int(args.strategy[-1]), args.global_batch, ctx.world_size, args.precision)
        engine = ref.deepspeed_initialize(model, optimizer, config)
    return model, optimizer, engine


def run(args, ctx, device, dataset, name: str) -> dict:
    say = print if ctx.is_main else (lambda *a, **k: None)
    args = normalise(args)
    cfg = ref.model_config(args.model)
    per_rank = tokens.per_rank_batch(args.global_batch, ctx.world_size)
    if per_rank % args.grad_accum:
        raise ValueError(f"--grad-accum {args.grad_accum} must divide the {per_rank} sequences of each rank "
                         f"(--global-batch {args.global_batch} over {ctx.world_size} processes)")
    micro = per_rank // args.grad_accum
    strategy_mem = "ddp" if args.compute_only else args.strategy
    predicted = per_gpu_memory(cfg, ctx.world_size, strategy=strategy_mem, precision=ref.memory_precision(args.precision),
                               batch=micro, seq_len=args.seq_len, checkpointing=args.checkpointing != "none")
    record = {"run": name, "strategy": args.strategy, "precision": args.precision, "checkpointing": args.checkpointing,
              "ac_every": args.ac_every, "optimizer_impl": args.optimizer_impl, "grad_accum": args.grad_accum,
              "accum_sync": args.accum_sync, "accum_keep_gathered": args.accum_keep_gathered, "loss": args.loss,
              "loss_chunk_tokens": args.loss_chunk_tokens if args.loss == "chunked" else None,
              "reshard_after_forward": not args.no_reshard, "offload": args.offload, "compile": args.compile,
              "prefetch": None if args.compute_only or args.strategy != "fsdp" else args.prefetch,
              "prefetch_depth": args.prefetch_depth if args.prefetch == "explicit" else None,
              "compute_only": args.compute_only,
              "model": args.model, "n_params": count_parameters(cfg)["total"], "seq_len": args.seq_len,
              "global_batch": args.global_batch, "per_rank_batch": per_rank, "micro_batch": micro,
              "device": str(device), "attn_implementation": "sdpa",
              "predicted_gb": predicted["total"] / GB, "predicted": predicted}
    try:
        model, optimizer, engine = build(args, ctx, device, cfg)
        record["optimizer_impl_resolved"] = ref.optimizer_impl(optimizer)
        if args.strategy == "fsdp" and not args.compute_only and not args.offload:
            peak = fsdp2_peak_memory(cfg, ctx.world_size, batch=micro, seq_len=args.seq_len, precision=args.precision,
                                     checkpointing=args.checkpointing, ac_every=args.ac_every, loss=args.loss,
                                     loss_chunk_tokens=args.loss_chunk_tokens,
                                     optimizer_impl=record["optimizer_impl_resolved"], grad_accum=args.grad_accum,
                                     accum_sync=args.accum_sync, accum_keep_gathered=args.accum_keep_gathered,
                                     reshard_after_forward=not args.no_reshard)
            record.update(predicted=peak, predicted_gb=peak["total"] / GB)
        data = ref.batches(dataset, args.global_batch, ctx.rank, ctx.world_size, seed=args.seed, device=device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        out = ref.train_steps(model, optimizer, data, args.steps, device=device, engine=engine,
                              warmup=args.warmup_steps, **step_options(args))
        record.update(out, status="ok", peak_memory_gb=out["peak_memory_bytes"] / GB)
        if device.type == "cuda":  # what the caching allocator reserved: allocated peak + fragmentation
            record["peak_reserved_gb"] = torch.cuda.max_memory_reserved(device) / GB
        ids, labels = next(ref.batches(dataset, args.global_batch, ctx.rank, ctx.world_size, seed=args.seed,
                                       device=device))
        autocast = torch.bfloat16 if args.compute_only and args.precision != "fp32" else None
        record["sdpa_backends"] = ref.sdpa_backends(lambda: ref.loss_sum(model, ids[:1], labels[:1], engine=engine,
                                                                          autocast_dtype=autocast))
        # MFU against the peak of the precision the step computes in (fp32 or bf16), not always bf16's;
        # HFU also counts the layer forwards that activation checkpointing runs again
        record.update(ref.throughput(cfg, args.seq_len, args.global_batch, out["median_step_s"], device,
                                     ctx.world_size if device.type == "cuda" else 1, precision=args.precision,
                                     recomputed_layers=ref.recomputed_layers(cfg.num_layers, args.checkpointing,
                                                                             args.ac_every)))
        if args.resume_check:
            record.update(resume_check(args, ctx, device, dataset, cfg, out["losses"]))
        if args.timed_repeats > 0:
            record.update(steady_timing(args, ctx, device, dataset, name, model, optimizer, engine))
    except torch.OutOfMemoryError as exc:  # what the calculator predicted: report it, go on with the next run
        record.update(status="oom", error=str(exc).splitlines()[0])
    finally:
        model = optimizer = engine = None
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    write_record(record)
    if record["status"] == "ok" and record.get("timing"):
        t, exposed = record["timing"], record.get("exposed_comm_s")
        say(f"[{name}] steady step {t['median_s'] * 1e3:.1f} ms [{t['q25_s'] * 1e3:.1f}-{t['q75_s'] * 1e3:.1f}] "
            f"(steady: {t['steady']}), {record['collective_count_per_step']} collectives "
            f"({record['collective_bytes_per_step'] / 2**20:.2f} MiB) per step"
            + (f", exposed communication {exposed * 1e3:.1f} ms" if exposed is not None else ""))
    if record["status"] == "ok":
        mfu = (f", MFU {record['mfu']:.1%} with the LM head ({record['mfu_no_head']:.1%} without), "
               f"HFU {record['hfu']:.1%}" if record.get("mfu") is not None else "")
        say(f"[{name}] loss {record['losses'][0]:.3f} -> {record['losses'][-1]:.3f}, "
            f"{record['tokens_per_s']:,.0f} tokens/s{mfu}, peak {record['peak_memory_gb']:.2f} GB "
            f"({record['memory_kind']}), predicted {record['predicted_gb']:.2f} GB; AdamW "
            f"{record['optimizer_impl_resolved']}, SDPA {'/'.join(record['sdpa_backends']) or 'none'}")
    else:
        say(f"[{name}] out of memory (predicted {record['predicted_gb']:.1f} GB per rank)")
    return record


#: The compute-only runs of this launch, by the settings a step's computation depends on: the baseline that
#: a later FSDP run with the same settings subtracts (exposed communication).
_BASELINES: dict[tuple, bench.Measurement] = {}


def steady_timing(args, ctx, device, dataset, name: str, model, optimizer, engine) -> dict:
    """After the training steps: the collectives of one step (counted), then steps timed until steady
    (``dlo.measure.bench``: warm-up until 3 steps agree, then ``--timed-repeats`` steps). Every rank takes
    the slowest rank's time of each step (``agreed_timer``, an all-reduce *between* steps), so all ranks
    run the same steps. Exposed communication = this step's median − the compute-only baseline's median
    (a run with ``--compute-only`` and the same model, batch and precision, earlier in the launch)."""
    data = ref.batches(dataset, args.global_batch, ctx.rank, ctx.world_size, seed=args.seed, start_step=args.steps,
                       device=device)
    autocast = torch.bfloat16 if args.compute_only and args.precision != "fp32" else None

    def step():
        ids, labels = next(data)
        ref.train_step(model, optimizer, ids, labels, engine=engine, autocast_dtype=autocast, **step_options(args))

    with ref.CollectiveCounter() as counter:
        step()
    collectives = counter.summary()
    m = bench.measure(name, step, items_per_call=args.global_batch * args.seq_len, unit="tokens/s",
                      warmup=bench.Warmup(max_calls=args.warmup_max_calls), repeats=args.timed_repeats,
                      device=device, track_memory=False, progress=False, timer=agreed_timer(device))
    out = {"timing": m.to_record(), "collectives_per_step": collectives,
           "collective_count_per_step": sum(c["count"] for c in collectives.values()),
           "collective_bytes_per_step": sum(c["bytes"] for c in collectives.values()),
           "exposed_comm_s": None, "exposed_comm_low_s": None, "exposed_comm_high_s": None, "baseline_run": None}
    key = (args.model, args.seq_len, args.global_batch, args.precision, args.checkpointing, args.ac_every, args.compile,
           args.loss, args.grad_accum, args.optimizer_impl)
    if args.compute_only:
        _BASELINES[key] = m
    elif key in _BASELINES:
        base = _BASELINES[key]
        out.update(exposed_comm_s=m.median_s - base.median_s, baseline_run=base.name,
                   exposed_comm_low_s=m.q25_s - base.q75_s, exposed_comm_high_s=m.q75_s - base.q25_s)
    return out


def resume_check(args, ctx, device, dataset, cfg, straight: list[float]) -> dict:
    """Train ``steps // 2``, save, rebuild everything (other seed), load, train the rest: same losses?"""
    if args.strategy != "fsdp":
        raise ValueError("--resume-check uses FSDP's sharded state dicts: use --strategy fsdp")
    half = args.steps // 2
    folder = Path(tempfile.mkdtemp(prefix="dcp-")) if ctx.is_main else None
    if ctx.is_distributed:  # one folder for all ranks (a shared file system on clusters)
        box = [str(folder) if folder else None]
        dist.broadcast_object_list(box, src=0)
        folder = Path(box[0])
    model, optimizer, _ = build(args, ctx, device, cfg)
    data = ref.batches(dataset, args.global_batch, ctx.rank, ctx.world_size, seed=args.seed, device=device)
    first = ref.train_steps(model, optimizer, data, half, device=device, track_memory=False,
                            **step_options(args))["losses"]
    save_checkpoint(folder / "ckpt", model, optimizer, half)
    model, optimizer, _ = build(argparse.Namespace(**{**vars(args), "seed": args.seed + 1}), ctx, device, cfg)
    step = load_checkpoint(folder / "ckpt", model, optimizer)
    data = ref.batches(dataset, args.global_batch, ctx.rank, ctx.world_size, seed=args.seed, start_step=step,
                       device=device)
    rest = ref.train_steps(model, optimizer, data, args.steps - step, device=device, track_memory=False,
                           **step_options(args))["losses"]
    if ctx.is_distributed:
        dist.barrier()
    if ctx.is_main:
        shutil.rmtree(folder, ignore_errors=True)
    return {"resumed_losses": first + rest, "resumed_from": step, "resume_bit_exact": first + rest == straight}


def main(argv=None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:  # every configuration's options checked before a process group or a model exists
        for _, run_args in expand_runs(args, args.runs):
            normalise(argparse.Namespace(**vars(run_args)))
    except ValueError as exc:
        parser.refuse(exc)
    # dlo.runtime: torchrun or srun variables; nccl on GPUs, gloo on CPU. FSDP, DCP and DeepSpeed need a process
    # group even for one process (one GPU, or plain `python fsdp_train.py`): group_of_one makes it.
    ctx = init_distributed(group_of_one=True)
    device = torch.device("cuda", ctx.local_rank) if pick_device().type == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    say = print if ctx.is_main else (lambda *a, **k: None)
    try:
        cfg = ref.model_config(args.model)
        dataset, vocab = tokens.token_dataset(args.seq_len, source=args.data, tokenizer=args.tokenizer,
                                              vocab_size=None if args.data else cfg.vocab_size,
                                              n_sequences=max(64, 4 * args.global_batch), seed=args.seed)
        if vocab > cfg.vocab_size:
            raise ValueError(f"the tokenizer has {vocab} tokens, more than the model's {cfg.vocab_size}")
        say(f"{ctx.world_size} process(es) on {device}; {cfg.name}: {count_parameters(cfg)['total']:,} parameters; "
            f"data: {dataset.description}")
        runs, skipped = plan(args)
        for rec in skipped:  # one line each (rank 0), and one record, which the notebook reads as "not run"
            say(f"[{rec['run']}] skipped: {rec['skipped']}")
            if ctx.is_main:
                write_record(rec)
        for name, run_args in runs:  # several configurations, one launch
            run(run_args, ctx, device, dataset, name)
    finally:
        teardown()


if __name__ == "__main__":
    main()
    exit_after_success()  # DeepSpeed's globals can abort a finished rank at interpreter exit
