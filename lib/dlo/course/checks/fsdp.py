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
from pathlib import Path
from typing import Callable

import torch

from dlo.course.checks import fsdp_cases as cases
from dlo.course.checks.cases import compare
from dlo.course.checks.framework import CheckFailed, expect, peer_records, register
from dlo.course.checks.ddp import _explain_ddp_errors, fake_context, one_process_group
from dlo.parallel import fsdp

SCRIPT = "tp_fsdp/fsdp_train.py"
WORKER = Path(__file__).with_name("fsdp_worker.py")
STEPS_WORKER = Path(__file__).with_name("fsdp_steps_worker.py")
#: The world sizes a multi-process check runs on: 2, and 3 (which splits none of the models' widths evenly).
WORLD_SIZES = (2, 3)


def _tiny():

    return fsdp.build_llama(fsdp.SMOKE_LLAMA, seed=0)


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))


@register("fsdp", "ddp", ("wrap_ddp",), SCRIPT)
def _check_ddp(wrap_ddp: Callable) -> str:
    from torch.nn.parallel import DistributedDataParallel as DDP

    answer, wrap_ddp = wrap_ddp, _explain_ddp_errors(wrap_ddp)
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
    _on_processes(answer, "ddp")
    return ("DDP replicates the whole model (trained as torch's DDP trains it on 2 and 3 processes): the baseline "
            "whose memory the calculator predicts")


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
    answer, apply_fsdp = apply_fsdp, _explain_fsdp_errors(apply_fsdp)
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
    _on_processes(answer, "fsdp")
    return ("one FSDP unit per decoder layer plus the root: all-gathered one layer at a time, trained as the reference "
            "on 2 and 3 processes; mixed precision and offload policies reach every unit")


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


def _checkpointed_run(apply_activation_checkpointing: Callable, shape) -> None:
    """On a model of ``shape``: the same loss and gradients as the plain model, each decoder layer run twice (its
    forward, then its recomputation in backward), the rest of the model once."""
    plain, model = cases.TinyLM(shape), apply_activation_checkpointing(cases.TinyLM(shape))
    expect(model is not None, "return the model")
    body = next(m for m in model.modules() if isinstance(m, cases.Body))
    layers = [m for m in body.modules() if isinstance(m, cases.Layer)]
    norm_calls = []
    body.norm.register_forward_hook(lambda *_: norm_calls.append(1))
    ids = cases.batch(shape, 0, 0)
    got, want = cases.loss_of(model, ids), cases.loss_of(plain, ids)
    got.backward()
    want.backward()
    problem = (compare(got.item(), want.item(), "the loss", scale=10)
               or cases.weights_problem(model, plain, "the gradient", grads=True))
    expect(not problem, f"with {shape.label}: {problem} (reference: the same model without checkpointing)")
    expect(len(norm_calls) == 1, f"with {shape.label}: the final norm ran {len(norm_calls)} times for one forward and "
                                 "backward: the whole model was recomputed in backward, not every decoder layer by "
                                 "itself (the root's activations are kept; FSDP shards each layer apart)")
    calls = [layer.calls for layer in layers]
    wrong = [i for i, n in enumerate(calls) if n != 2]
    expect(not wrong, f"with {shape.label}: decoder layer(s) {wrong} ran their forward {[calls[i] for i in wrong]} "
                      "time(s) for one forward and backward, expected 2 (the forward, then its recomputation in "
                      "backward): every decoder layer must be recomputed as a whole in backward")


@register("fsdp", "checkpointing", ("apply_activation_checkpointing",), SCRIPT)
def _check_checkpointing(apply_activation_checkpointing: Callable) -> str:
    for shape in cases.SHAPES:
        _checkpointed_run(apply_activation_checkpointing, shape)
    ids = _ids()
    ref, model = _tiny(), apply_activation_checkpointing(_tiny())
    expect(model is not None, "return the model")
    got, want = model(input_ids=ids).logits, ref(input_ids=ids).logits
    problem = compare(got, want, "the logits") or compare(_grads_of(model, got), _grads_of(ref, want), "the gradient")
    expect(not problem, f"with the smoke Llama (transformers): {problem} (reference: without checkpointing)")
    return (f"each decoder layer keeps its input only and recomputes the rest in backward ({len(cases.SHAPES)} models "
            "and the smoke Llama: same loss and gradients, each layer run twice, the rest once)")


def _grads_of(model, out) -> list:
    out.sum().backward()
    return [p.grad for p in model.parameters()]


def _resharded_after_forward(model, layers) -> list[bool]:
    """For each layer, whether its weights are sharded again after a forward: FSDP2 registers the gathered
    (plain) tensors while a unit runs and swaps the sharded DTensors back only if it reshards."""
    model(input_ids=_ids())
    return [all(_is_sharded(p) for p in layer.parameters()) for layer in layers]


@register("fsdp", "reshard", ("apply_fsdp",), SCRIPT)
def _check_reshard(apply_fsdp: Callable) -> str:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    answer, apply_fsdp = apply_fsdp, _explain_fsdp_errors(apply_fsdp)
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
    _on_processes(answer, "reshard")
    return ("True frees each layer's weights after forward (re-gathered in backward), False keeps them: what each of "
            "2 and 3 processes holds after a forward, and the gradients, as the reference's")


def _compiled(module) -> bool:
    from torch._dynamo.eval_frame import OptimizedModule

    return isinstance(module, OptimizedModule) or getattr(module, "_compiled_call_impl", None) is not None


@register("fsdp", "compile", ("compile_layers",), SCRIPT)
def _check_compile(compile_layers: Callable) -> str:
    models = [("the smoke Llama (transformers)", _tiny)] + [(s.label, lambda s=s: cases.TinyLM(s)) for s in cases.SHAPES]
    for label, make in models:
        model = compile_layers(make())
        expect(model is not None, "return the model")
        layers = list(model.model.layers)
        missing = [i for i, layer in enumerate(layers) if not _compiled(layer)]
        expect(not (missing and _compiled(model)), f"with {label}: the root model is compiled, not each decoder "
                                                   "layer: compile every decoder layer itself (FSDP wraps the root next)")
        expect(not missing, f"with {label}: decoder layer(s) {missing} of {len(layers)} are not compiled: compile every "
                            "decoder layer itself (the module in model.model.layers must be the compiled one)")
        expect(not _compiled(model), f"with {label}: compile the layers, not the root (FSDP wraps the root next)")
        renamed = [k for k in model.state_dict() if "_orig_mod" in k]
        expect(not renamed, f"with {label}: the weights were renamed ({renamed[0] if renamed else ''}): "
                            "torch.compile(layer) put into the list wraps each layer, so checkpoints and from_pretrained "
                            "no longer find the names; compile in place with layer.compile()")
        expect(list(model.state_dict()) == list(make().state_dict()),
               f"with {label}: compiling must keep the model's weight names")
    return (f"each decoder layer compiled in place ({len(models)} models of 1 to 3 layers); FSDP's per-layer hooks "
            "stay outside the graphs")


def _script_of(fn: Callable) -> Path:
    """The script file that defines ``fn``: the checks' processes import it."""
    code = getattr(fn, "__code__", None)
    script = Path(code.co_filename) if code else Path("?")
    expect(script.suffix == ".py" and script.is_file(),
           f"{getattr(fn, '__name__', fn)} must be defined in a script file (fsdp_train.py) so that several "
           "processes can import it")
    return script


def _expect_no_problem(records: list[dict], n: int) -> None:
    """No rank failed nor found a difference; else the first one, naming the world size and the rank."""
    errors = [(r["rank"], r["error"]) for r in records if r["error"]]
    errors.sort(key=lambda e: "(another rank failed)" in e[1])
    expect(not errors, f"on {n} processes, rank {errors[0][0]}: {errors[0][1]}" if errors else "")
    problems = [(r["rank"], p) for r in records for p in r["problems"]]
    expect(not problems, f"on {n} processes, rank {problems[0][0]}, {problems[0][1]}" if problems else "")


def _on_processes(fn: Callable, step: str) -> None:
    """``step``'s comparison with the reference on 2 and on 3 gloo processes (:mod:`fsdp_steps_worker`)."""
    script = _script_of(fn)
    for n in WORLD_SIZES:
        _expect_no_problem(peer_records(STEPS_WORKER, [str(script), step], n, timeout_s=240), n)


def _dcp_on_processes(save_checkpoint: Callable, load_checkpoint: Callable) -> None:
    """The same save and load on 2 and 3 processes (one shard each), by :mod:`dlo.course.checks.fsdp_worker`."""
    script = _script_of(save_checkpoint)
    for n in WORLD_SIZES:
        with tempfile.TemporaryDirectory() as tmp:
            records = peer_records(WORKER, [str(script), tmp], n, timeout_s=240)
        for name in ("save", "load"):
            calls = [r[f"{name}s"] for r in records]
            expect(len(set(calls)) == 1,
                   f"on {n} processes dcp.{name} ran on rank(s) {[r for r, k in enumerate(calls) if k]} only: it is "
                   f"collective, every rank must call it (each rank {'writes' if name == 'save' else 'reads'} its "
                   "own shard; called on some ranks only, a real run hangs)")
        _expect_no_problem(records, n)


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
    _dcp_on_processes(save_checkpoint, load_checkpoint)
    return ("each rank saves and loads its own shards (checked on 2 and 3 processes); weights and AdamW state "
            "restored bit for bit")


# The two configuration steps (offload, deepspeed) live beside this module; importing it registers them.
import dlo.course.checks.fsdp_configs  # noqa: E402,F401
