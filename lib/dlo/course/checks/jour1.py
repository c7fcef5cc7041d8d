"""Checkers of Jour1/jour1.ipynb.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.course.checks.jour1_probes import (AutocastSpy, backend_config, compiled_call, explain_no_autocast,
                                           explain_not_channels_last)


# --------------------------------------------------------------------------------------------------
# Small helpers shared by the checkers
# --------------------------------------------------------------------------------------------------

class _Recorder(nn.Module):
    """A tiny conv net that records the autocast / grad / training state seen during its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4, 10)
        self.seen: list[dict[str, Any]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dev = x.device.type
        self.seen.append({
            "autocast": torch.is_autocast_enabled(dev),
            "dtype": torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None,
            "grad": torch.is_grad_enabled(),
            "inference": torch.is_inference_mode_enabled(),
            "training": self.training,
        })
        h = torch.relu(self.bn(self.conv(x)))
        return self.fc(h.mean(dim=(2, 3)))


def _batch(n: int = 8, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def _params_changed(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(p.detach(), before[n]) for n, p in model.named_parameters())


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters()}


# --------------------------------------------------------------------------------------------------
# Jour1
# --------------------------------------------------------------------------------------------------

J1 = "Jour1/jour1.ipynb"


@register("jour1", "device", ("to_device",), J1)
def _check_to_device(to_device: Callable) -> str:
    class Spy:
        def __init__(self) -> None:
            self.calls: list[tuple[tuple, dict]] = []

        def to(self, *args: Any, **kwargs: Any) -> "Spy":
            self.calls.append((args, kwargs))
            return self

    # the spies move nothing, so any device can be asked for: a GPU index other than 0 shows a device chosen
    # inside the function instead of the one given
    for device in (torch.device("cuda", 1), torch.device("cpu")):
        images, labels = Spy(), Spy()
        out = to_device(images, labels, device)
        expect(isinstance(out, tuple) and len(out) == 2,
               f"return the pair (images, labels) as a tuple, got {type(out).__name__}")
        for name, spy in (("images", images), ("labels", labels)):
            expect(len(spy.calls) >= 1, f"{name} were not moved: they stay where the loader left them")
            expect(len(spy.calls) == 1, f"{name} were copied {len(spy.calls)} times: move them exactly once per batch")
            args, kwargs = spy.calls[0]
            target = args[0] if args else kwargs.get("device")
            expect(target is not None and torch.device(target) == device,
                   f"move {name} to the given device: asked for {device}, they went to {target}")
            expect(kwargs.get("non_blocking") is True,
                   f"{name} are copied synchronously (non_blocking not set): the CPU waits for each copy instead of "
                   "queueing it while the GPU computes")
    device = torch.device("cpu")
    x, y = _batch()
    x2, y2 = to_device(x, y, device)
    expect(torch.equal(x2, x) and torch.equal(y2, y), "the tensors' values must not change")
    return "both tensors are moved with .to(device, non_blocking=True)"


@register("jour1", "amp", ("train_step_amp",), J1)
def _check_amp(train_step_amp: Callable) -> str:
    x, y = _batch()
    for dtype in (torch.bfloat16, torch.float16):  # the dtype is an argument: try more than one value
        torch.manual_seed(0)
        model = _Recorder()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = _snapshot(model)
        with AutocastSpy() as entered:
            loss = train_step_amp(model, x, y, opt, nn.CrossEntropyLoss(), dtype)
        expect(bool(model.seen), "call the model on the images")
        seen = model.seen[-1]
        if not seen["autocast"]:
            explain_no_autocast(entered, x.device.type)
        expect(seen["dtype"] == dtype,
               f"autocast must use the dtype argument: asked for {dtype}, the forward ran under {seen['dtype']}")
        expect(isinstance(loss, torch.Tensor) and loss.ndim == 0, "return the loss as a 0-d tensor (no .item())")
        expect(loss.dtype == torch.float32, "the loss should be float32 (autocast runs cross-entropy in fp32)")
        expect(_params_changed(model, before), "do the backward pass and the optimizer step (parameters did not change)")
        expect(all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters()),
               "gradients of fp32 parameters must stay fp32: only the forward runs under autocast")
    return "forward under autocast in the dtype asked for (bf16 and fp16 tried), fp32 loss and gradients, parameters updated"


@register("jour1", "fp16", ("train_step_fp16",), J1)
def _check_fp16(train_step_fp16: Callable) -> str:
    calls: list[str] = []

    class SpyScaler(torch.amp.GradScaler):
        def scale(self, outputs):  # type: ignore[override]
            calls.append("scale")
            return super().scale(outputs)

        def step(self, optimizer, *args, **kwargs):  # type: ignore[override]
            calls.append("step")
            return super().step(optimizer, *args, **kwargs)

        def update(self, new_scale=None):  # type: ignore[override]
            calls.append("update")
            return super().update(new_scale)

    torch.manual_seed(0)
    model = _Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _snapshot(model)
    x, y = _batch()
    scaler = SpyScaler("cpu", init_scale=2.0**8)
    try:
        loss = train_step_fp16(model, x, y, opt, nn.CrossEntropyLoss(), scaler)
    except AssertionError as exc:  # GradScaler's own checks (CheckFailed is raised by us, not by the scaler)
        if isinstance(exc, CheckFailed):
            raise
        raise CheckFailed(f"GradScaler refused the call order ({exc}): the backward goes through the scaled loss, "
                          "then the scaler's step (which unscales and checks for inf), then its update, in that "
                          "order") from None
    expect(bool(model.seen) and model.seen[-1]["autocast"] and model.seen[-1]["dtype"] == torch.float16,
            "the forward pass did not run under autocast with float16 (fp16)")
    expect(calls[:1] == ["scale"], "the backward ran on the unscaled loss: small fp16 gradients underflow to zero; "
                                   "the backward must go through the scaler's scaled loss")
    expect("step" in calls, "the optimizer stepped without the scaler's step: the gradients were never divided back "
                            "by the scale, and an overflowed step would not be skipped")
    expect("update" in calls and calls.index("step") < calls.index("update"),
           "the scaler's update must come after its step, in that order (it adapts the scale to what the step found)")
    expect(isinstance(loss, torch.Tensor), "return the (unscaled) loss tensor")
    expect(_params_changed(model, before), "the optimizer step did not change the parameters")
    # The update itself: scaler.step divides the gradients by the scale, so they must have been computed
    # from the scaled loss. A backward on the unscaled loss gives an update `scale` times too small.
    torch.manual_seed(0)
    ref = _Recorder()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        ref_loss = nn.CrossEntropyLoss()(ref(x), y)
    ref_opt.zero_grad(set_to_none=True)
    ref_loss.backward()  # what scale -> backward -> unscale computes (no overflow at this scale)
    ref_opt.step()
    got = torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()])
    want = torch.cat([(p.detach() - before[n]).flatten() for n, p in ref.named_parameters()])
    ratio = (got.norm() / want.norm()).item()
    expect(abs(ratio - 1) < 0.05,
           f"the update is {ratio:.3g} x the expected one "
           + ("(about 1/scale: the backward ran on the unscaled loss; call backward on scaler.scale(loss), "
              "which scaler.step then unscales)" if ratio < 0.1 else "(the gradients were scaled or unscaled twice)"))
    return "fp16 autocast, backward on the scaled loss, scaler.step then scaler.update: the update has the right size"


def _grad_norm(params) -> float:
    """The total 2-norm of the gradients of ``params`` (those that have one), as clip_grad_norm_ computes it."""
    grads = [p.grad.detach().float().flatten() for p in params if p.grad is not None]
    return torch.cat(grads).norm().item() if grads else 0.0


def _close(a: float, b: float, rel: float = 0.02) -> bool:
    return abs(a - b) <= rel * abs(b)


class _ClipSpyScaler(torch.amp.GradScaler):
    """A GradScaler that records each call, with the gradient norm at unscale_ and at step (what the optimizer
    reads: measured there, a correct answer may clear the gradients after the step)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, float]] = []
        self.unscaled, self.max_abs = False, 0.0  # unscale_ called in this step; largest |gradient| at the step

    @staticmethod
    def _norm(optimizer) -> float:
        return _grad_norm([p for g in optimizer.param_groups for p in g["params"]])

    def scale(self, outputs):  # type: ignore[override]
        self.calls.append(("scale", 0.0))
        return super().scale(outputs)

    def unscale_(self, optimizer):  # type: ignore[override]
        self.calls.append(("unscale_", self._norm(optimizer)))
        self.unscaled = True
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):  # type: ignore[override]
        # what the optimizer will read: the step unscales the gradients itself when unscale_ was not called
        divide = 1.0 if self.unscaled else float(self.get_scale())
        grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
        self.max_abs = max((g.detach().abs().max().item() for g in grads), default=0.0) / divide
        self.calls.append(("step", self._norm(optimizer) / divide))
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):  # type: ignore[override]
        self.calls.append(("update", 0.0))
        self.unscaled = False
        return super().update(new_scale)


_CLIP_SCALE, _CLIP_LR = 2.0**12, 0.1


def _clip_criterion(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """20 x cross-entropy: the gradient norm (about 11) is above the thresholds a student might hard-code."""
    return 20.0 * nn.functional.cross_entropy(out, target)


def _run_fp16_clip(train_step_fp16_clip: Callable, max_norm: float, images: torch.Tensor,
                   labels: torch.Tensor) -> dict[str, Any]:
    """One step of the student's function on a fresh model: the calls, the gradient norms it produced."""
    torch.manual_seed(0)
    model = _Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=_CLIP_LR)
    before = _snapshot(model)
    scaler = _ClipSpyScaler("cpu", init_scale=_CLIP_SCALE)
    try:
        train_step_fp16_clip(model, images, labels, opt, _clip_criterion, scaler, max_norm)
    except RuntimeError as exc:  # GradScaler's own refusals, e.g. unscale_ twice
        if "unscale_() has already been called" in str(exc):
            raise CheckFailed("the gradients were unscaled twice in one step: GradScaler refused a second unscale "
                              "before its update (the gradients would be divided by the scale twice)") from None
        raise
    names = [c for c, _ in scaler.calls]
    at_step = [n for c, n in scaler.calls if c == "step"]
    explicit = [n for c, n in scaler.calls[:names.index("step")] if c == "unscale_"] if "step" in names else \
        [n for c, n in scaler.calls if c == "unscale_"]
    return {"model": model, "calls": names, "unscale_norms": explicit, "before": before,
            "norm": at_step[0] if at_step else _grad_norm(model.parameters()), "scale_after": scaler.get_scale(),
            "max_abs": scaler.max_abs,
            "changed": _params_changed(model, before)}


def _explain_clip_norm(a: dict, na: float, nb: float, ma: float, mb: float, true_norm: float) -> None:
    """The gradient norm the optimizer saw is not max_norm: name the mistake (always raises)."""
    scale = _CLIP_SCALE
    expect(not (a["max_abs"] <= ma * 1.001 and na > ma * 1.05),
           f"each gradient value was clipped apart to [-max_norm, max_norm]: their total norm is still {na:.3g}, "
           f"above max_norm={ma:.3g}; the norm of all gradients together must be scaled down")
    expect(not _close(na, true_norm),
           f"the gradients were not clipped: their norm at the step is {na:.3g}, above max_norm={ma:.3g} (clipping "
           f"the loss, or each value apart, does not bound the norm of all gradients together)")
    unscaled_at = a["unscale_norms"]  # the gradient norm when the student called unscale_ (before step)
    if _close(na * scale, ma, 0.05) or _close(na * scale, true_norm, 0.05):  # off by exactly the scale
        expect(bool(unscaled_at),
               f"you clipped the gradients while they were still multiplied by the loss scale ({scale:.0f}), or "
               f"divided them by it by hand: let the scaler unscale them (its own method) before clipping; its "
               f"step then does not unscale them again")
        expect(not _close(unscaled_at[0], ma, 0.05),
               f"you clipped before unscaling: the gradients were still multiplied by the loss scale ({scale:.0f}), "
               f"so the threshold was max_norm x scale in true units; unscale first, then clip")
        expect(False,
               f"the gradients were divided by the loss scale twice (norm {na:.3g}, {scale:.0f}x too small): the "
               f"scaler's unscale already divided them, and its step does not do it again")
    expect(not (_close(na, nb) and not _close(na, ma)),
           f"clip to the max_norm argument: asked for {ma:.3g} then {mb:.3g}, the gradient norm at the step was "
           f"{na:.3g} both times")
    expect(False, f"at the step the gradient norm is {na:.3g}, expected max_norm={ma:.3g}: unscale, then clip the "
                  f"norm of all gradients together")


@register("jour1", "fp16_clip", ("train_step_fp16_clip",), J1)
def _check_fp16_clip(train_step_fp16_clip: Callable) -> str:
    x, y = _batch()
    torch.manual_seed(0)
    ref = _Recorder()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        ref_loss = _clip_criterion(ref(x), y)
    ref_loss.backward()  # the true (unscaled) gradients of this step
    true_norm = _grad_norm(ref.parameters())

    # phase 1: the order of the scaler's calls
    ma, mb = true_norm / 4, true_norm * 0.4
    a = _run_fp16_clip(train_step_fp16_clip, ma, x, y)
    seen = a["model"].seen
    expect(bool(seen) and seen[-1]["autocast"] and seen[-1]["dtype"] == torch.float16,
           "the forward pass did not run under autocast with float16 (fp16)")
    calls = a["calls"]
    expect(calls[:1] == ["scale"], "the backward ran on the unscaled loss: small fp16 gradients underflow; go "
                                   "through the scaler's scale first")
    expect("step" in calls,
           "the optimizer stepped without the scaler: it would not skip a step whose gradients overflowed (and the "
           "scaler must know that you already unscaled them)")
    expect("update" in calls and calls.index("step") < calls.index("update"),
           "the scaler's update never came after its step: the scale would never adapt for the next step")
    # phase 2: the norm the optimizer saw, for two thresholds
    b = _run_fp16_clip(train_step_fp16_clip, mb, x, y)
    na, nb = a["norm"], b["norm"]
    if not (_close(na, ma) and _close(nb, mb)):
        _explain_clip_norm(a, na, nb, ma, mb, true_norm)
    expect(not a["unscale_norms"] or _close(a["unscale_norms"][0], true_norm * _CLIP_SCALE),
           "the gradients were changed before the scaler unscaled them: unscale right after backward, before "
           "anything else touches the gradients")
    # phase 3: the update used the clipped gradients: SGD moves each parameter by lr x its gradient
    delta = torch.cat([(p.detach() - a["before"][n]).flatten() for n, p in a["model"].named_parameters()])
    expect(_close(delta.norm().item(), _CLIP_LR * ma, 0.05),
           f"the update has norm {delta.norm().item():.3g}, expected lr x max_norm = {_CLIP_LR * ma:.3g}: step once, "
           f"after clipping")
    # phase 4: an overflowing step (an inf in the input) is skipped, and the scale lowered for the next one
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    c = _run_fp16_clip(train_step_fp16_clip, ma, bad, y)
    expect(not c["changed"],
           "the step was not skipped although the gradients overflowed (inf/NaN): the scaler's step must decide")
    expect(c["scale_after"] < _CLIP_SCALE,
           f"after an overflow the scale must be lowered (it stayed {c['scale_after']:.0f}): the scaler's update must "
           f"run after its step")
    return (f"unscale_ before clipping: the gradients are clipped to max_norm in true units (norm {na:.3g} asked "
            f"{ma:.3g}), the update uses them, and an overflowing step is skipped with the scale lowered")


@register("jour1", "channels_last", ("to_channels_last",), J1)
def _check_channels_last(to_channels_last: Callable) -> str:
    model = _Recorder()
    x, _ = _batch()
    out = to_channels_last(model, x)
    expect(isinstance(out, tuple) and len(out) == 2, "return the pair (model, images)")
    m, x2 = out
    cl = torch.channels_last
    expect(m.conv.weight.is_contiguous(memory_format=cl),
           "the model's weights are still NCHW in memory: the returned model was not converted to channels_last")
    expect(isinstance(x2, torch.Tensor) and x2.shape == x.shape,
           f"the images must keep their shape {tuple(x.shape)} (N, C, H, W), got "
           f"{tuple(x2.shape) if isinstance(x2, torch.Tensor) else type(x2).__name__}: channels_last changes the "
           "layout in memory, not the order of the axes (no permute)")
    if not (x2.is_contiguous(memory_format=cl) and not x2.is_contiguous()):
        explain_not_channels_last(x, x2)
    expect(torch.equal(x2, x), "the values must not change, only the layout")
    return "model weights and images are NHWC (channels_last) in memory"


@register("jour1", "cudnn", ("enable_cudnn_benchmark",), J1)
def _check_cudnn(enable_cudnn_benchmark: Callable) -> str:
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        enable_cudnn_benchmark()
        expect(torch.backends.cudnn.benchmark is True,
               "after your function cuDNN's benchmark flag is still off: the autotuner never runs (a flag set only "
               "inside a block, or a neighbouring setting, does not stay on)")
    finally:
        torch.backends.cudnn.benchmark = old
    return "cuDNN will time its convolution algorithms on the first call of each shape and keep the fastest"


@register("jour1", "compile", ("compile_model",), J1)
def _check_compile(compile_model: Callable) -> str:
    model = _Recorder()
    compiled = compile_model(model)
    expect(compiled is not None, "your function returned None: return the compiled model")
    expect(not isinstance(compiled, torch.jit.ScriptModule),
           "this is TorchScript (torch.jit), not torch.compile: TorchScript does not fuse operations with Inductor")
    expect(isinstance(compiled, nn.Module),
           f"what you returned is a {type(compiled).__name__}, not the model: compile the module itself (it keeps "
           "its parameters, .train() and .eval())")
    if isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule):
        target, config = compiled._orig_mod, getattr(compiled.dynamo_ctx, "compiler_config", True)
    else:
        call = compiled_call(compiled)
        expect(call is not None, "the model you returned is not compiled: calling it runs eagerly (neither the "
                                 "module nor its forward goes through torch.compile)")
        original = call._torchdynamo_orig_callable
        target = compiled if getattr(original, "__self__", compiled) is compiled else original.__self__
        config = backend_config(call)
    expect(target is model, "you compiled another module than the one given (a copy?): the model being trained would "
                            "stay eager")
    # the backend: only Inductor generates fused kernels ('eager' and 'aot_eager' trace and run the same kernels)
    expect(config is not None, "the backend you chose only traces the model (e.g. backend='eager'): it generates no "
                               "fused kernel; keep the default backend")
    return "torch.compile wraps the model; compilation happens lazily at the first call"


@register("jour1", "batch_sweep", ("largest_batch",), J1)
def _check_batch_sweep(largest_batch: Callable) -> str:
    tried: list[int] = []

    def try_batch(bs: int) -> dict[str, Any]:
        tried.append(bs)
        if bs > 64:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated for batch {bs})")
        return {"batch_size": bs, "throughput": {16: 100.0, 32: 180.0, 64: 150.0}.get(bs, 1.0)}  # peaks at 32

    best, results = largest_batch(try_batch, [16, 32, 64, 128, 256])
    expect(not tried or tried[0] == 16,
           f"try the batch sizes in the order given, from the smallest (you tried {tried}): the sweep stops at the "
           "first one that does not fit")
    expect(best != 32, "you reported the batch with the best throughput (32), not the largest batch that fits (64): "
                       "throughput can drop before memory runs out")
    expect(best == 64, f"the largest batch that fits is 64 here, got {best!r}")
    expect(tried == [16, 32, 64, 128], f"stop at the first out-of-memory error (tried {tried})")
    expect(isinstance(results, list) and [r["batch_size"] for r in results] == [16, 32, 64],
            "return the results of the batches that fitted, in order")
    best_none, res_none = largest_batch(lambda bs: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")), [8])
    expect(best_none is None and res_none == [], "when nothing fits, return (None, [])")
    # RuntimeError is OutOfMemoryError's parent: catching it (or Exception) would hide real bugs too
    for bug in (ValueError("a real bug"), RuntimeError("a real bug: shapes do not match")):
        other = None
        try:
            largest_batch(lambda bs, bug=bug: (_ for _ in ()).throw(bug), [8])
        except type(bug) as exc:
            other = exc
        expect(other is not None,
               f"catch only torch.OutOfMemoryError: a {type(bug).__name__} is a bug and must propagate "
               "(`except RuntimeError` or `except Exception` is too broad)")
    return "OOM is caught (and only OOM), the sweep stops there and reports the largest batch that fit"


@register("jour1", "profiler", ("profile_steps",), J1)
def _check_profiler(profile_steps: Callable) -> str:
    model = _Recorder()
    x, y = _batch()
    for wait, warmup, active in ((1, 1, 2), (2, 1, 3)):  # the schedule is an argument: try two of them
        calls = []

        def step() -> None:
            calls.append(1)
            nn.functional.cross_entropy(model(x), y).backward()

        total = wait + warmup + active
        with tempfile.TemporaryDirectory() as d:
            prof = profile_steps(step, d, wait=wait, warmup=warmup, active=active)
            traces = list(Path(d).rglob("*.json"))
            expect(len(calls) == total, f"step() ran {len(calls)} times: the schedule needs wait + warmup + active = "
                                        f"{total} steps, the first ones skipped")
            expect(prof is not None and hasattr(prof, "key_averages"),
                   f"your function returned {type(prof).__name__}, not the profiler")
            expect(getattr(prof, "step_num", 0) == total,
                   f"the profiler saw {getattr(prof, 'step_num', 0)} steps, expected {total}: the schedule only "
                   f"advances when told after each step (prof.step()), so it never reached the active steps")
            convs = {e.key: e.count for e in prof.key_averages() if e.key == "aten::conv2d"}
            recorded = convs.get("aten::conv2d", 0)
            expect(bool(traces), "no trace file was written into trace_dir: the profiler needs a handler that writes "
                                 "the TensorBoard trace when the active steps end (tensorboard_trace_handler)")
            expect(recorded == active,
                   f"the trace holds {recorded} steps, the schedule you were given asks for the {active} active ones "
                   f"(wait={wait}, warmup={warmup}): without a schedule of those counts (or with numbers of your own) "
                   f"the slow first steps end up in the trace")
    return "trace written for TensorBoard/Perfetto with the wait/warm-up/active schedule asked for"


@register("jour1", "evaluate", ("evaluate_fast",), J1)
def _check_evaluate(evaluate_fast: Callable) -> str:
    torch.manual_seed(0)
    model = _Recorder()
    data = [_batch(n, seed) for seed, n in enumerate((8, 5, 3))]  # batches of different sizes
    acc = evaluate_fast(model, data)
    expect(bool(model.seen), "run the model on every batch")
    seen = model.seen[-1]
    expect(seen["inference"] or not seen["grad"],
           "the forward passes built an autograd graph: evaluation needs no gradients (inference_mode or no_grad)")
    expect(not seen["training"], "the model was still in training mode: BatchNorm normalised with each batch's "
                                 "statistics (and updated its running ones) instead of model.eval()'s behaviour")
    model.eval()
    with torch.no_grad():
        expected = sum((model(x).argmax(1) == y).sum().item() for x, y in data) / sum(len(y) for _, y in data)
    per_batch = sum((model(x).argmax(1) == y).float().mean().item() for x, y in data) / len(data)
    correct = expected * sum(len(y) for _, y in data)
    expect(not (isinstance(acc, float) and abs(acc - correct / (len(data) * len(data[0][1]))) < 1e-9),
           f"you divided by the number of batches times the first batch's size: the last batches are smaller; "
           f"divide the correct predictions by the number of images ({expected:.3f})")
    expect(not (isinstance(acc, float) and abs(acc - per_batch) < 1e-9 and abs(per_batch - expected) > 1e-9),
           f"you averaged the batches' accuracies ({per_batch:.3f}): with batches of different sizes count the "
           f"correct predictions and divide by the number of images ({expected:.3f})")
    expect(isinstance(acc, float) and abs(acc - expected) < 1e-9, f"return the accuracy as a float ({expected:.3f} here), got {acc!r}")
    return "eval mode, no autograd graph, accuracy correct"

import dlo.course.checks.jour1_timer  # noqa: E402,F401  (the step timer's checker, registered after the steps above)
