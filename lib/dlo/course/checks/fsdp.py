"""Checkers of tp_fsdp/fsdp_train.py (``dlo check fsdp <step>``): the script's functions on a small Llama.

They run in this process: a one-process gloo group is enough to build FSDP2 units (``fully_shard``), save and
load sharded checkpoints; the results are compared with the reference in :mod:`dlo.parallel.fsdp`. The
checkpoint step is also run on 2 processes (:mod:`dlo.course.checks.fsdp_worker`): ``dcp.save`` and ``dcp.load``
are collective, and each rank must write and read its own shard.

What FSDP2 did is observed through its public surface only: a unit is an ``FSDPModule``, and it gathers its
parameters that are not inside a nested unit; a parameter at rest is a ``DTensor`` sharded on dim 0, and the
unit's registered parameters are plain (gathered) tensors only while it runs, or after its forward when it does
not reshard; the weight dtype a layer computes with is seen by a forward pre-hook; whether every unit got the
offload policy is seen by a policy that counts how often FSDP2 reads it.
"""
from __future__ import annotations

import tempfile
from unittest import mock
from pathlib import Path
from typing import Callable

import torch

from dlo.course.checks.framework import CheckFailed, expect, peer_records, register
from dlo.course.checks.ddp import _explain_ddp_errors, fake_context, one_process_group
from dlo.parallel import fsdp

SCRIPT = "tp_fsdp/fsdp_train.py"
WORKER = Path(__file__).with_name("fsdp_worker.py")


def _tiny():

    return fsdp.build_llama(fsdp.SMOKE_LLAMA, seed=0)


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


@register("fsdp", "ddp", ("wrap_ddp",), SCRIPT)
def _check_ddp(wrap_ddp: Callable) -> str:
    from torch.nn.parallel import DistributedDataParallel as DDP

    wrap_ddp = _explain_ddp_errors(wrap_ddp)
    single = wrap_ddp(_tiny(), fake_context(), torch.device("cpu"))
    expect(not isinstance(single, DDP), "with one process (ctx.is_distributed False) return the model itself")
    # the device is an argument: "meta" (shapes, no data) shows whether the model was moved there
    moved = wrap_ddp(_tiny(), fake_context(), torch.device("meta"))
    where = {p.device.type for p in moved.parameters()}
    expect(where == {"meta"}, f"move the model to the device it is given (model.to(device)): asked for meta, its "
                              f"parameters are on {sorted(where)}")
    with one_process_group():
        for rank in (0, 1):
            wrapped = wrap_ddp(_tiny(), fake_context(rank, 2), torch.device("cpu"))
            expect(isinstance(wrapped, DDP), f"with several processes (here rank {rank} of 2) wrap the model in "
                                             "DistributedDataParallel on every rank: test ctx.is_distributed")
        expect(wrapped.device_ids is None, "on the CPU pass device_ids=None")
    return "DDP replicates the whole model: the baseline whose memory the calculator predicts"


def _units(model) -> tuple[list, object]:
    from torch.distributed.fsdp import FSDPModule

    layers = list(model.model.layers)
    expect(all(isinstance(layer, FSDPModule) for layer in layers),
            "call fully_shard on every decoder layer (model.model.layers), one FSDP unit each")
    expect(isinstance(model, FSDPModule), "call fully_shard on the root model last (embeddings, norm, head)")
    return layers, model


def _managed(unit) -> list:
    """The parameters an FSDP unit gathers itself: its own, less those inside a nested FSDP unit."""
    from torch.distributed.fsdp import FSDPModule

    nested = {id(p) for name, sub in unit.named_modules() if name and isinstance(sub, FSDPModule)
              for p in sub.parameters()}
    return [p for p in unit.parameters() if id(p) not in nested]


def _is_sharded(p) -> bool:
    """A parameter as FSDP2 registers it between uses: a DTensor sharded on dim 0 (its local piece only)."""
    from torch.distributed.tensor import DTensor, Shard

    return isinstance(p, DTensor) and all(isinstance(pl, Shard) for pl in p.placements)


def _layers_gathered_during(model, layers, ids) -> list[list[int]]:
    """For each layer, the indices of the OTHER layers whose weights are gathered (plain tensors, not sharded
    DTensors) while it computes: FSDP2 swaps a unit's registered parameters for the gathered ones only while
    that unit runs."""
    gathered: list[list[int]] = []

    def hook(i):
        def pre(module, args):
            gathered.append([j for j, other in enumerate(layers)
                             if j != i and any(not _is_sharded(p) for p in other.parameters())])
        return pre

    hooks = [layer.register_forward_pre_hook(hook(i)) for i, layer in enumerate(layers)]
    try:
        model(input_ids=ids)
    finally:
        for h in hooks:
            h.remove()
    return gathered


def _counting_offload():
    """A CPU offload policy that counts how often FSDP2 reads it: each unit built with it reads it while it sets
    up its parameters, so a model built with it reads it as often as the reference model built with it."""
    from torch.distributed.fsdp import CPUOffloadPolicy

    class Counting(CPUOffloadPolicy):
        reads = 0

        def __getattribute__(self, name):
            if name == "pin_memory":
                type(self).reads += 1
            return object.__getattribute__(self, name)

    return Counting(pin_memory=False)  # pinned memory needs a GPU


def _explain_fsdp_errors(apply_fsdp: Callable) -> Callable:
    """``apply_fsdp`` with fully_shard's errors turned into a CheckFailed that says the likely cause."""
    def call(*args, **kwargs):
        try:
            return apply_fsdp(*args, **kwargs)
        except NotImplementedError:
            raise
        except (TypeError, RuntimeError, AssertionError) as exc:
            if isinstance(exc, CheckFailed):
                raise
            raise CheckFailed(f"fully_shard failed ({type(exc).__name__}: {str(exc).splitlines()[0][:120]}): shard the "
                              "layers FIRST, then the root (a parameter already sharded by the root cannot be sharded "
                              "again by a layer)") from None
    return call


def _bf16_forward(apply_fsdp: Callable, ids, **extra) -> tuple[object, list]:
    """The model ``apply_fsdp`` builds with a bf16 policy (and ``extra``), and the weight dtype each decoder
    layer's MLP computed with in one forward."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = apply_fsdp(_tiny(), mp_policy=mp, **extra)
    layers, _ = _units(model)
    seen: list[torch.dtype] = []
    hooks = [layer.mlp.register_forward_pre_hook(lambda m, args: seen.append(m.down_proj.weight.dtype))
             for layer in layers]
    try:
        model(input_ids=ids)
    except RuntimeError as exc:  # e.g. fp32 layers fed bf16 activations by a bf16 root
        raise CheckFailed(f"with a bf16 MixedPrecisionPolicy the forward failed ({str(exc).splitlines()[0][:100]}): "
                          "pass mp_policy=... to every fully_shard call, layers and root alike") from None
    finally:
        for h in hooks:
            h.remove()
    expect(len(seen) == len(layers) and all(d == torch.bfloat16 for d in seen),
           f"with mp_policy=MixedPrecisionPolicy(param_dtype=bfloat16) the layers computed with weights in {seen}: "
           "pass mp_policy=... to every fully_shard call (layers and root), else bf16 runs train in fp32")
    return model, seen


@register("fsdp", "fsdp", ("apply_fsdp",), SCRIPT)
def _check_fsdp(apply_fsdp: Callable) -> str:
    apply_fsdp = _explain_fsdp_errors(apply_fsdp)
    ids = _ids()
    expected = _tiny()(input_ids=ids).logits
    with one_process_group():
        model = apply_fsdp(_tiny())
        layers, root = _units(model)
        root_params = {id(p) for p in _managed(root)}
        expect(not any(id(p) in root_params for layer in layers for p in layer.parameters()),
                "shard the layers FIRST, then the root: otherwise the root unit owns every parameter "
                "(one giant all-gather, no per-layer overlap)")
        expect(all(_is_sharded(p) for p in model.parameters()),
                "every parameter should be a sharded DTensor after fully_shard")
        for i, others in enumerate(_layers_gathered_during(model, layers, ids)):
            expect(not others, f"while decoder layer {i} computes, the weights of layer(s) {others} are gathered too: "
                               "each layer must be its own unit, sharded before the root (one layer gathered at a time)")
        got = model(input_ids=ids).logits
        expect(torch.allclose(got, expected, atol=1e-5, rtol=1e-4),
               "the sharded model must compute what the plain model computes (fp32, no policy given)")
        # mp_policy and offload are arguments: a bf16 run must really compute in bf16 in every unit, and the
        # offload policy must reach every unit (FSDP2 reads it once per parameter it sets up)
        ref_off = _counting_offload()
        fsdp.apply_fsdp(_tiny(), offload=ref_off)
        off = _counting_offload()
        _bf16_forward(apply_fsdp, ids, offload=off)
        expect(type(off).reads == type(ref_off).reads,
               "pass offload (the OffloadPolicy argument) to every fully_shard call as offload_policy=...: "
               f"{'no unit' if not type(off).reads else 'not every unit'} got it")
    return ("one FSDP unit per decoder layer plus the root: all-gathered one layer at a time; mixed precision "
            "and offload policies reach every unit")


#: Names mixed_precision_policy must refuse: only "fp32" and "bf16" are known.
UNKNOWN_PRECISIONS = ("fp16", "fp8", "", None, "bf61", "fp64", "bf16-mixed", "float32", "BF16 ", 16)


@register("fsdp", "precision", ("mixed_precision_policy",), SCRIPT)
def _check_precision(mixed_precision_policy: Callable) -> str:
    expect(mixed_precision_policy("fp32") is None, "fp32: return None (no mixed precision policy)")
    mp = mixed_precision_policy("bf16")
    expect(getattr(mp, "param_dtype", None) == torch.bfloat16,
            "bf16: param_dtype=torch.bfloat16 (the all-gathered weights used to compute)")
    expect(getattr(mp, "reduce_dtype", None) == torch.float32,
            "bf16: reduce_dtype=torch.float32 (gradients summed over ranks in fp32, not in bf16)")
    for name in UNKNOWN_PRECISIONS:  # near misses of the two names, other precisions, empty, not a string
        try:
            got = mixed_precision_policy(name)
        except ValueError:
            continue
        except (TypeError, AttributeError) as exc:
            expect(not isinstance(name, str), f"{name!r} raised {type(exc).__name__}, not ValueError")
            continue
        shown = "None (fp32)" if got is None else f"a policy with param_dtype={getattr(got, 'param_dtype', None)}"
        raise CheckFailed(f"the unknown precision name {name!r} gave {shown}: only 'fp32' and 'bf16' are known, and any "
                          "other name must raise ValueError rather than be mapped silently to a precision")
    return ("bf16 compute and all-gathers, fp32 gradient reduction and fp32 sharded weights; "
            f"{len(UNKNOWN_PRECISIONS)} unknown names refused")


@register("fsdp", "checkpointing", ("apply_activation_checkpointing",), SCRIPT)
def _check_checkpointing(apply_activation_checkpointing: Callable) -> str:
    ids = _ids()
    ref = _tiny()
    model = apply_activation_checkpointing(_tiny())
    expect(model is not None, "return the model")
    expect(all(type(layer).__name__ == "CheckpointWrapper" for layer in model.model.layers),
            "wrap every decoder layer with checkpoint_wrapper (and put it back in model.model.layers)")
    out, expected = model(input_ids=ids).logits, ref(input_ids=ids).logits
    torch.testing.assert_close(out, expected, msg="checkpointing must not change the result")
    out.sum().backward()
    expected.sum().backward()
    torch.testing.assert_close(model.model.layers[0].mlp.down_proj.weight.grad, ref.model.layers[0].mlp.down_proj.weight.grad,
                               msg="nor the gradients")
    return "each layer keeps its input only and recomputes the rest in backward"


def _resharded_after_forward(model, layers) -> list[bool]:
    """For each layer, whether its weights are sharded again after a forward: FSDP2 registers the gathered
    (plain) tensors while a unit runs and swaps the sharded DTensors back only if it reshards."""
    model(input_ids=_ids())
    return [all(_is_sharded(p) for p in layer.parameters()) for layer in layers]


@register("fsdp", "reshard", ("apply_fsdp",), SCRIPT)
def _check_reshard(apply_fsdp: Callable) -> str:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    apply_fsdp = _explain_fsdp_errors(apply_fsdp)
    bf16 = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with one_process_group():
        # the flag must reach the layers whatever else is asked for (a precision policy, an offload policy)
        for extra, how in (({}, ""), ({"mp_policy": bf16, "offload": _counting_offload()},
                                      " (with mp_policy and offload given too)")):
            kept = apply_fsdp(_tiny(), reshard_after_forward=False, **extra)
            layers, _ = _units(kept)
            expect(not any(_resharded_after_forward(kept, layers)),
                    f"reshard_after_forward=False must reach every layer's fully_shard call{how}: a layer "
                    "resharded its weights after forward")
            freed = apply_fsdp(_tiny(), reshard_after_forward=True, **extra)
            layers, _ = _units(freed)
            expect(all(_resharded_after_forward(freed, layers)),
                    f"reshard_after_forward=True must reach every layer's fully_shard call{how}: each layer frees "
                    "its gathered weights after forward, but one kept them")
    return "True frees each layer's weights after forward (re-gathered in backward); False keeps them"


@register("fsdp", "offload", ("offload_policy",), SCRIPT)
def _check_offload(offload_policy: Callable) -> str:
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    off = offload_policy(torch.device("cpu"), False)
    expect(type(off) is OffloadPolicy, f"not enabled: return the base OffloadPolicy, which offloads nothing, got "
                                       f"{off!r}")
    # the device argument decides, not the machine: both calls are made as on a machine with GPUs, the GPU one
    # also as on a machine without any (the checker's own)
    for gpus in (True, False):
        with mock.patch("torch.cuda.is_available", return_value=gpus):
            try:
                on = offload_policy(torch.device("cuda", 0), True)
            except ValueError as exc:
                raise CheckFailed(f"enabled on a GPU (cuda:0) it raised ValueError ({str(exc)[:80]}): decide from the "
                                  "device argument (device.type == 'cuda'), not from this machine or the device's "
                                  "index") from None
        expect(isinstance(on, CPUOffloadPolicy), "enabled on a GPU: return CPUOffloadPolicy(...)")
        expect(on.pin_memory, "pin_memory=True: page-locked CPU memory copies to and from the GPU faster")
    with mock.patch("torch.cuda.is_available", return_value=True):
        try:
            offload_policy(torch.device("cpu"), True)
        except ValueError:
            pass
        else:
            raise CheckFailed("offload asked while training on the CPU must raise ValueError (nothing to offload), "
                              "even on a machine that has GPUs: the device argument decides")
    return "sharded state in CPU memory on GPUs; a clear error where it cannot apply"


@register("fsdp", "compile", ("compile_layers",), SCRIPT)
def _check_compile(compile_layers: Callable) -> str:
    from torch._dynamo.eval_frame import OptimizedModule

    model = compile_layers(_tiny())
    expect(model is not None, "return the model")
    ok = all(isinstance(layer, OptimizedModule) or getattr(layer, "_compiled_call_impl", None) is not None
             for layer in model.model.layers)
    expect(ok, "compile every decoder layer itself (layer.compile()): not a part of it, not the whole model")
    expect(not isinstance(model, OptimizedModule) and getattr(model, "_compiled_call_impl", None) is None,
           "compile the layers, not the root (FSDP wraps the root next)")
    renamed = [k for k in model.state_dict() if "_orig_mod" in k]
    expect(not renamed, f"the weights were renamed ({renamed[0] if renamed else ''}): torch.compile(layer) put into "
                        "the list wraps each layer, so checkpoints and from_pretrained no longer find the names; "
                        "compile in place with layer.compile()")
    expect(list(model.state_dict()) == list(_tiny().state_dict()), "compiling must keep the model's weight names")
    return "each decoder layer compiled in place; FSDP's per-layer hooks stay outside the graphs"


def _dcp_on_two_processes(save_checkpoint: Callable, load_checkpoint: Callable) -> None:
    """The same save and load on 2 processes (one shard each), by :mod:`dlo.course.checks.fsdp_worker`."""
    code = getattr(save_checkpoint, "__code__", None)
    script = Path(code.co_filename) if code else Path("?")
    expect(script.suffix == ".py" and script.is_file(),
           "save_checkpoint must be defined in a script file (fsdp_train.py) so that 2 processes can import it")
    with tempfile.TemporaryDirectory() as tmp:
        records = peer_records(WORKER, [str(script), tmp], 2)
    for name in ("save", "load"):
        calls = [r[f"{name}s"] for r in records]
        expect(len(set(calls)) == 1,
               f"on 2 processes dcp.{name} ran on rank(s) {[r for r, n in enumerate(calls) if n]} only: it is "
               f"collective, every rank must call it (each rank {'writes' if name == 'save' else 'reads'} its own "
               "shard; called on some ranks only, a real run hangs)")
    errors = [(r["rank"], r["error"]) for r in records if r["error"]]
    errors.sort(key=lambda e: "(another rank failed)" in e[1])
    expect(not errors, f"on 2 processes, rank {errors[0][0]}: {errors[0][1]}" if errors else "")
    problems = [p for r in records for p in r["problems"]]
    expect(not problems, f"on 2 processes: {problems[0]}" if problems else "")


@register("fsdp", "dcp", ("save_checkpoint", "load_checkpoint"), SCRIPT)
def _check_dcp(save_checkpoint: Callable, load_checkpoint: Callable) -> str:

    with one_process_group(), tempfile.TemporaryDirectory() as tmp:
        model = fsdp.apply_fsdp(_tiny())
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        fsdp.lm_loss(model(input_ids=_ids()).logits, _ids()).backward()
        opt.step()
        save_checkpoint(Path(tmp) / "ckpt", model, opt, 7)
        expect((Path(tmp) / "ckpt").is_dir(), "write the checkpoint with dcp.save(..., checkpoint_id=str(path))")
        other = fsdp.apply_fsdp(fsdp.build_llama(fsdp.SMOKE_LLAMA, seed=5))
        other_opt = torch.optim.AdamW(other.parameters(), lr=1e-3)
        step = load_checkpoint(Path(tmp) / "ckpt", other, other_opt)
        expect(step == 7, f"return the saved step (7), got {step!r}")
        for (k, a), (_, b) in zip(model.state_dict().items(), other.state_dict().items()):
            expect(torch.equal(a.full_tensor(), b.full_tensor()), f"weights differ after loading: {k}")
        sa, sb = opt.state_dict()["state"], other_opt.state_dict()["state"]
        expect(len(sb) == len(sa) and all(torch.equal(sa[i]["exp_avg"].full_tensor(), sb[i]["exp_avg"].full_tensor())
                                           for i in sa), "the optimizer state (AdamW moments) must be restored too")
    _dcp_on_two_processes(save_checkpoint, load_checkpoint)
    return ("each rank saves and loads its own shards (checked on 2 processes); weights and AdamW state restored "
            "bit for bit")


@register("fsdp", "deepspeed", ("deepspeed_config",), SCRIPT)
def _check_deepspeed(deepspeed_config: Callable) -> str:
    for stage in (1, 2, 3):
        cfg = deepspeed_config(stage, 8, 2)
        expect(cfg.get("zero_optimization", {}).get("stage") == stage, "zero_optimization: {'stage': stage}")
        expect(cfg.get("train_batch_size") == 8, "train_batch_size is the global batch")
        expect(cfg.get("train_micro_batch_size_per_gpu") == 4, "train_micro_batch_size_per_gpu = global batch / world size")
        expect(cfg.get("gradient_accumulation_steps") == 1, "gradient_accumulation_steps: 1")
    for precision, on in (("bf16", True), ("fp32", False)):
        section = deepspeed_config(3, 8, 2, precision).get("bf16")
        expect(isinstance(section, dict), f"precision {precision!r}: 'bf16' must be a section with an 'enabled' key, got "
                                          f"{section!r} (DeepSpeed ignores a bare value there)")
        expect(section.get("enabled") is on, f"precision {precision!r}: the bf16 section must be enabled "
                                             f"only for bf16, got {section!r}")
    for bad in ((4, 8, 2), (1, 5, 2)):
        try:
            deepspeed_config(*bad)
        except ValueError:
            continue
        raise CheckFailed(f"deepspeed_config{bad} must raise ValueError (stage 1-3; world size must divide the batch)")
    return "ZeRO stage, global and per-rank batch in one JSON config"
