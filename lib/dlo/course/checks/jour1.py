"""Checkers of Jour1/jour1.ipynb.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect, register


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

    images, labels = Spy(), Spy()
    device = torch.device("cpu")
    out = to_device(images, labels, device)
    expect(isinstance(out, tuple) and len(out) == 2, "return the pair (images, labels)")
    for name, spy in (("images", images), ("labels", labels)):
        expect(len(spy.calls) == 1, f"call {name}.to(...) exactly once")
        args, kwargs = spy.calls[0]
        target = args[0] if args else kwargs.get("device")
        expect(target is not None and torch.device(target) == device, f"move {name} to the given device")
        expect(kwargs.get("non_blocking") is True,
                f"pass non_blocking=True to {name}.to(): with pinned memory the copy then overlaps GPU work")
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
        loss = train_step_amp(model, x, y, opt, nn.CrossEntropyLoss(), dtype)
        expect(bool(model.seen), "call the model on the images")
        seen = model.seen[-1]
        expect(seen["autocast"], "run the forward pass inside torch.autocast(device_type=..., dtype=dtype)")
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
        raise CheckFailed(f"GradScaler refused the call order ({exc}): call scaler.scale(loss).backward(), "
                          "then scaler.step(optimizer) (which unscales and checks for inf), then scaler.update(), "
                          "in that order") from None
    expect(bool(model.seen) and model.seen[-1]["autocast"] and model.seen[-1]["dtype"] == torch.float16,
            "run the forward pass inside torch.autocast(..., dtype=torch.float16)")
    expect(calls[:1] == ["scale"], "call scaler.scale(loss).backward() instead of loss.backward()")
    expect("step" in calls and "update" in calls and calls.index("step") < calls.index("update"),
            "then scaler.step(optimizer) (not optimizer.step()) and scaler.update(), in that order")
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


@register("jour1", "fp16_clip", ("train_step_fp16_clip",), J1)
def _check_fp16_clip(train_step_fp16_clip: Callable) -> str:
    # A loss scale small enough that the scaled fp16 backward does not overflow on these inputs, and a loss 20x
    # cross-entropy so that the gradient norm (about 11) is above the thresholds a student might hard-code.
    scale, lr, k = 2.0**12, 0.1, 20.0
    x, y = _batch()

    def criterion(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return k * nn.functional.cross_entropy(out, target)

    torch.manual_seed(0)
    ref = _Recorder()
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        ref_loss = criterion(ref(x), y)
    ref_loss.backward()  # the true (unscaled) gradients of this step
    true_norm = _grad_norm(ref.parameters())

    def run(max_norm: float, images: torch.Tensor) -> dict[str, Any]:
        calls: list[tuple[str, float]] = []

        class SpyScaler(torch.amp.GradScaler):
            """Records each call, and for unscale_ the gradient norm at that moment."""

            def scale(self, outputs):  # type: ignore[override]
                calls.append(("scale", 0.0))
                return super().scale(outputs)

            def unscale_(self, optimizer):  # type: ignore[override]
                params = [p for g in optimizer.param_groups for p in g["params"]]
                calls.append(("unscale_", _grad_norm(params)))
                return super().unscale_(optimizer)

            def step(self, optimizer, *args, **kwargs):  # type: ignore[override]
                calls.append(("step", 0.0))
                return super().step(optimizer, *args, **kwargs)

            def update(self, new_scale=None):  # type: ignore[override]
                calls.append(("update", 0.0))
                return super().update(new_scale)

        torch.manual_seed(0)
        model = _Recorder()
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        before = _snapshot(model)
        scaler = SpyScaler("cpu", init_scale=scale)
        try:
            train_step_fp16_clip(model, images, y, opt, criterion, scaler, max_norm)
        except RuntimeError as exc:  # GradScaler's own refusals, e.g. unscale_ twice
            if "unscale_() has already been called" in str(exc):
                raise CheckFailed("call scaler.unscale_(optimizer) once per step: GradScaler refused a second call "
                                  "before scaler.update() (the gradients would be divided by the scale twice)") from None
            raise
        names = [c for c, _ in calls]
        explicit = [n for c, n in calls[:names.index("step")] if c == "unscale_"] if "step" in names else \
            [n for c, n in calls if c == "unscale_"]
        return {"model": model, "calls": names, "unscale_norms": explicit, "before": before,
                "norm": _grad_norm(model.parameters()), "scale_after": scaler.get_scale(),
                "changed": _params_changed(model, before)}

    a = run(true_norm / 4, x)
    expect(bool(a["model"].seen) and a["model"].seen[-1]["autocast"] and a["model"].seen[-1]["dtype"] == torch.float16,
           "run the forward pass inside torch.autocast(..., dtype=torch.float16)")
    calls = a["calls"]
    expect(calls[:1] == ["scale"], "call scaler.scale(loss).backward(), not loss.backward()")
    expect("step" in calls,
           "do the step with scaler.step(optimizer), not optimizer.step(): it skips the step when the gradients "
           "overflowed (and does not unscale them again after your unscale_)")
    expect("update" in calls and calls.index("step") < calls.index("update"),
           "call scaler.update() after scaler.step(optimizer): it adapts the scale for the next step")
    b = run(true_norm * 0.4, x)
    na, nb = a["norm"], b["norm"]
    ma, mb = true_norm / 4, true_norm * 0.4
    if _close(na, ma) and _close(nb, mb):
        unscaled_at = a["unscale_norms"]
        expect(not unscaled_at or _close(unscaled_at[0], true_norm * scale),
               "call scaler.unscale_(optimizer) right after backward, before anything else touches the gradients")
    else:
        expect(not _close(na, true_norm),
               f"the gradients were not clipped: their norm after the step is {na:.3g}, above max_norm={ma:.3g}; clip "
               f"them with torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) (clipping the loss does not "
               f"bound the gradients)")
        unscaled_at = a["unscale_norms"]  # the gradient norm when the student called unscale_ (before step)
        if _close(na * scale, ma, 0.05) or _close(na * scale, true_norm, 0.05):  # off by exactly the scale
            expect(bool(unscaled_at),
                   f"you clipped the gradients while they were still multiplied by the loss scale ({scale:.0f}), or "
                   f"divided them by it twice: call scaler.unscale_(optimizer) (not a division of your own) before "
                   f"clip_grad_norm_; scaler.step then does not unscale them again")
            expect(not _close(unscaled_at[0], ma, 0.05),
                   f"you clipped before scaler.unscale_(optimizer): the gradients were still multiplied by the loss "
                   f"scale ({scale:.0f}), so the threshold was max_norm x scale in true units; unscale first, then clip")
            expect(False,
                   f"the gradients were divided by the loss scale twice (norm {na:.3g}, {scale:.0f}x too small): "
                   f"scaler.unscale_ already divided them, and scaler.step does not do it again after unscale_")
        expect(not (_close(na, nb) and not _close(na, ma)),
               f"clip to the max_norm argument: asked for {ma:.3g} then {mb:.3g}, the gradient norm after the step "
               f"was {na:.3g} both times")
        expect(False, f"after the step the gradient norm is {na:.3g}, expected max_norm={ma:.3g}: unscale, then clip "
                      f"the norm of all gradients together with torch.nn.utils.clip_grad_norm_(model.parameters(), "
                      f"max_norm)")
    # the update used the clipped gradients: SGD moves each parameter by lr x its gradient
    delta = torch.cat([(p.detach() - a["before"][n]).flatten() for n, p in a["model"].named_parameters()])
    expect(_close(delta.norm().item(), lr * ma, 0.05),
           f"the update has norm {delta.norm().item():.3g}, expected lr x max_norm = {lr * ma:.3g}: step once, after "
           f"clipping")
    # an overflowing step (an inf in the input) is skipped, and the scale lowered for the next one
    bad = x.clone()
    bad[0, 0, 0, 0] = float("inf")
    c = run(true_norm / 4, bad)
    expect(not c["changed"],
           "the step was not skipped although the gradients overflowed (inf/NaN): let scaler.step(optimizer) do it")
    expect(c["scale_after"] < scale,
           f"after an overflow scaler.update() must lower the scale (it stayed {c['scale_after']:.0f}): call it "
           f"after scaler.step(optimizer)")
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
    expect(m.conv.weight.is_contiguous(memory_format=cl), "convert the model: model.to(memory_format=torch.channels_last)")
    expect(isinstance(x2, torch.Tensor) and x2.shape == x.shape,
           f"the images must keep their shape {tuple(x.shape)} (N, C, H, W), got "
           f"{tuple(x2.shape) if isinstance(x2, torch.Tensor) else type(x2).__name__}: channels_last changes the "
           "layout in memory, not the order of the axes (no permute)")
    expect(x2.is_contiguous(memory_format=cl) and not x2.is_contiguous(),
            "convert the images too: images = images.contiguous(memory_format=torch.channels_last) (it returns a "
            "new tensor, unlike model.to which converts the model in place)")
    expect(torch.equal(x2, x), "the values must not change, only the layout")
    return "model weights and images are NHWC (channels_last) in memory"


@register("jour1", "cudnn", ("enable_cudnn_benchmark",), J1)
def _check_cudnn(enable_cudnn_benchmark: Callable) -> str:
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        enable_cudnn_benchmark()
        expect(torch.backends.cudnn.benchmark is True, "set torch.backends.cudnn.benchmark = True")
    finally:
        torch.backends.cudnn.benchmark = old
    return "cuDNN will time its convolution algorithms on the first call of each shape and keep the fastest"


@register("jour1", "compile", ("compile_model",), J1)
def _check_compile(compile_model: Callable) -> str:
    model = _Recorder()
    compiled = compile_model(model)
    expect(isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule),
            "return torch.compile(model) (an OptimizedModule wrapping the model)")
    expect(getattr(compiled, "_orig_mod", None) is model, "compile the model you were given")
    return "torch.compile wraps the model; compilation happens lazily at the first call"


@register("jour1", "batch_sweep", ("largest_batch",), J1)
def _check_batch_sweep(largest_batch: Callable) -> str:
    tried: list[int] = []

    def try_batch(bs: int) -> dict[str, Any]:
        tried.append(bs)
        if bs > 64:
            raise torch.OutOfMemoryError(f"CUDA out of memory (simulated for batch {bs})")
        return {"batch_size": bs, "throughput": float(bs)}

    best, results = largest_batch(try_batch, [16, 32, 64, 128, 256])
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
            expect(len(calls) == total, f"call step() wait + warmup + active = {total} times (called {len(calls)})")
            expect(prof is not None and hasattr(prof, "key_averages"), "return the profiler object")
            expect(getattr(prof, "step_num", 0) == total,
                   f"call prof.step() after each step: the schedule counts steps only through it "
                   f"(the profiler saw {getattr(prof, 'step_num', 0)} steps, expected {total})")
            convs = {e.key: e.count for e in prof.key_averages() if e.key == "aten::conv2d"}
            recorded = convs.get("aten::conv2d", 0)
            expect(bool(traces), "write the trace with on_trace_ready=torch.profiler.tensorboard_trace_handler(trace_dir)")
            expect(recorded == active,
                   f"the trace holds {recorded} steps, the schedule asks for the {active} active ones: pass "
                   f"schedule=torch.profiler.schedule(wait=wait, warmup=warmup, active=active) so that the "
                   f"warm-up steps (slow, first calls) stay out of it")
    return "trace written for TensorBoard/Perfetto with the wait/warm-up/active schedule asked for"


@register("jour1", "evaluate", ("evaluate_fast",), J1)
def _check_evaluate(evaluate_fast: Callable) -> str:
    torch.manual_seed(0)
    model = _Recorder()
    data = [_batch(n, seed) for seed, n in enumerate((8, 5, 3))]  # batches of different sizes
    acc = evaluate_fast(model, data)
    expect(bool(model.seen), "run the model on every batch")
    seen = model.seen[-1]
    expect(seen["inference"] or not seen["grad"], "wrap the loop in torch.inference_mode() (or torch.no_grad())")
    expect(not seen["training"], "call model.eval() so BatchNorm uses its running statistics")
    model.eval()
    with torch.no_grad():
        expected = sum((model(x).argmax(1) == y).sum().item() for x, y in data) / sum(len(y) for _, y in data)
    per_batch = sum((model(x).argmax(1) == y).float().mean().item() for x, y in data) / len(data)
    expect(not (isinstance(acc, float) and abs(acc - per_batch) < 1e-9 and abs(per_batch - expected) > 1e-9),
           f"you averaged the batches' accuracies ({per_batch:.3f}): with batches of different sizes count the "
           f"correct predictions and divide by the number of images ({expected:.3f})")
    expect(isinstance(acc, float) and abs(acc - expected) < 1e-9, f"return the accuracy as a float ({expected:.3f} here), got {acc!r}")
    return "eval mode, no autograd graph, accuracy correct"
