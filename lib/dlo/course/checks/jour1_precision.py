"""Checkers of Jour 1's mixed-precision steps: amp (``train_step_amp``), fp16 (``train_step_fp16``) and fp16_clip
(``train_step_fp16_clip``), registered by dlo.course.checks.jour1.

Each runs in two phases. First a fixed model that records the state its forward ran in, and a GradScaler that
records its calls: a mistake whose signature is certain there (no autocast, another dtype, the backward on the
unscaled loss, the scaler's calls out of order, the gradients clipped before unscaling) is named. Then the answer
and the reference run two consecutive steps on generated cases (dlo.course.checks.jour1_cases: conv and linear
models of several widths, with and without BatchNorm and Dropout, batches of 1, odd and even sizes, bf16 and fp16,
two criteria, initial scales that overflow float16 and scales that do not, clipping thresholds below and above the
gradient norm), and everything the steps leave behind is compared: the losses, the weights, the momentum buffers,
the scaler's state, the model's mode. The first difference is reported with its case.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks.framework import CheckFailed, expect
from dlo.course.checks.jour1_cases import (Recorder, Run, expect_same_steps, fixed_step, params_changed, small_batch,
                                          snapshot, step_cases)
from dlo.course.checks.jour1_probes import AutocastSpy, explain_no_autocast


def check_amp(train_step_amp: Callable) -> str:
    x, y = small_batch()
    for dtype in (torch.bfloat16, torch.float16):  # the dtype is an argument: try more than one value
        torch.manual_seed(0)
        model = Recorder()
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        before = snapshot(model)
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
        expect(params_changed(model, before), "do the backward pass and the optimizer step (parameters did not change)")
        expect(all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters()),
               "gradients of fp32 parameters must stay fp32: only the forward runs under autocast")
    n = generated_amp(train_step_amp)
    return (f"forward under autocast in the dtype asked for, fp32 loss and gradients: the same losses, weights and "
            f"optimizer state as the reference on {n} generated cases (bf16 and fp16, batches of 1 to 11)")


class _CallSpyScaler(torch.amp.GradScaler):
    """A GradScaler that records the names of its calls, in order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[str] = []

    def scale(self, outputs):  # type: ignore[override]
        self.calls.append("scale")
        return super().scale(outputs)

    def unscale_(self, optimizer):  # type: ignore[override]
        self.calls.append("unscale_")
        return super().unscale_(optimizer)

    def step(self, optimizer, *args, **kwargs):  # type: ignore[override]
        self.calls.append("step")
        return super().step(optimizer, *args, **kwargs)

    def update(self, new_scale=None):  # type: ignore[override]
        self.calls.append("update")
        return super().update(new_scale)


def _fp16_calls(calls: list[str]) -> None:
    """The scaler's calls in a right order, or what is wrong with them (a certain signature)."""
    expect(bool(calls), "the scaler passed in was never called (no scale, step or update on it): use the given "
                        "scaler, whose scale carries over from one step to the next")
    expect(calls[:1] == ["scale"], "the backward ran on the unscaled loss: small fp16 gradients underflow to zero; "
                                   "the backward must go through the scaler's scaled loss")
    expect("step" in calls, "the optimizer stepped without the scaler's step: "
           + ("" if "unscale_" in calls else "the gradients were never divided back by the scale, and ")
           + "a step whose gradients overflowed would not be skipped")
    expect("update" in calls and calls.index("step") < calls.index("update"),
           "the scaler's update must come after its step, in that order (it adapts the scale to what the step found)")


def check_fp16(train_step_fp16: Callable) -> str:
    torch.manual_seed(0)
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = snapshot(model)
    x, y = small_batch()
    scale = 2.0**8
    scaler = _CallSpyScaler("cpu", init_scale=scale)
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
    _fp16_calls(scaler.calls)
    expect(isinstance(loss, torch.Tensor), "return the (unscaled) loss tensor")
    expect(params_changed(model, before), "the optimizer step did not change the parameters")
    # The update itself: scaler.step divides the gradients by the scale, so they must have been computed
    # from the scaled loss. A backward on the unscaled loss gives an update `scale` times too small.
    torch.manual_seed(0)
    ref = Recorder()
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        ref_loss = nn.CrossEntropyLoss()(ref(x), y)
    ref_opt.zero_grad(set_to_none=True)
    ref_loss.backward()  # what scale -> backward -> unscale computes (no overflow at this scale)
    ref_opt.step()
    got = torch.cat([(p.detach() - before[n]).flatten() for n, p in model.named_parameters()])
    want = torch.cat([(p.detach() - before[n]).flatten() for n, p in ref.named_parameters()])
    ratio = (got.norm() / want.norm()).item()
    expect(abs(ratio * scale - 1) >= 0.05,
           f"the update is {ratio:.3g} x the expected one, 1/scale: the backward ran on the unscaled loss; call "
           "backward on scaler.scale(loss), which scaler.step then unscales")
    n = generated_fp16(train_step_fp16)
    return (f"fp16 autocast, backward on the scaled loss, scaler.step then scaler.update: the same losses, weights, "
            f"optimizer and scaler state as the reference on {n} generated cases (scales that overflow and not)")


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
        self.max_tensor = 0.0  # the largest norm of one parameter's gradient at the step

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
        self.max_tensor = max((g.detach().float().norm().item() for g in grads), default=0.0) / divide
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
    model = Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=_CLIP_LR)
    before = snapshot(model)
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
            "max_abs": scaler.max_abs, "max_tensor": scaler.max_tensor,
            "changed": params_changed(model, before)}


def _explain_clip_norm(a: dict, na: float, nb: float, ma: float, mb: float, true_norm: float) -> None:
    """The gradient norm the optimizer saw is not max_norm: name the mistake (always raises)."""
    scale = _CLIP_SCALE
    expect(not (_close(a["max_tensor"], ma, 0.001) and na > ma * 1.05),
           f"the gradient of each parameter was clipped apart to max_norm={ma:.3g}: their total norm is still "
           f"{na:.3g}; the norm of all gradients together must be scaled down")
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


def check_fp16_clip(train_step_fp16_clip: Callable) -> str:
    x, y = small_batch()
    torch.manual_seed(0)
    ref = Recorder()
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
    expect(bool(calls), "the scaler passed in was never called (no scale, unscale_, step or update on it): use the "
                        "given scaler, whose scale carries over from one step to the next")
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
    n = generated_fp16_clip(train_step_fp16_clip)
    return (f"unscale_ before clipping: the gradients are clipped to max_norm in true units (norm {na:.3g} asked "
            f"{ma:.3g}), the update uses them, an overflowing step is skipped with the scale lowered; the same "
            f"losses, weights, optimizer and scaler state as the reference on {n} generated cases")




# --------------------------------------------------------------------------------------------------
# The references and the generated cases
# --------------------------------------------------------------------------------------------------

def reference_amp(model, images, labels, optimizer, criterion, dtype=torch.bfloat16):
    with torch.autocast(device_type=images.device.type, dtype=dtype):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return loss.detach()


def reference_fp16(model, images, labels, optimizer, criterion, scaler, max_norm=None):
    with torch.autocast(device_type=images.device.type, dtype=torch.float16):
        loss = criterion(model(images), labels)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    if max_norm is not None:
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    scaler.step(optimizer)
    scaler.update()
    return loss.detach()


def reference_fp16_clip(model, images, labels, optimizer, criterion, scaler, max_norm):
    return reference_fp16(model, images, labels, optimizer, criterion, scaler, max_norm)


BF16, FP16 = torch.bfloat16, torch.float16
#: float16's largest value is 65504: 2**24 times a loss gradient overflows it, 2**4 .. 2**12 do not
NO_OVERFLOW, OVERFLOW = (2.0**4, 2.0**8, 2.0**12), (2.0**24,)
AMP_CASES = step_cases(10, dtypes=(BF16, FP16), criteria=("ce", "smooth"), seed=1, fixed=[
    fixed_step(n=1, dtype=FP16), fixed_step(kind="linear", width=5, norm=False, dropout=True, n=3, criterion="smooth")])
FP16_CASES = step_cases(10, dtypes=(FP16,), criteria=("ce", "smooth"), scales=NO_OVERFLOW + OVERFLOW, seed=2, fixed=[
    fixed_step(n=1, dtype=FP16, init_scale=2.0**8), fixed_step(n=3, dtype=FP16, init_scale=2.0**24),
    fixed_step(kind="linear", width=5, norm=False, dropout=True, n=5, dtype=FP16, criterion="smooth",
               init_scale=2.0**4)])


#: clipping thresholds, as multiples of the first step's gradient norm: below it (clipped) and above it (left alone)
CLIP_CASES = step_cases(8, dtypes=(FP16,), criteria=("ce x20", "smooth"), scales=NO_OVERFLOW,
                        clips=(0.25, 0.5, 0.9, 2.0, 4.0), seed=3, fixed=[
    fixed_step(n=1, dtype=FP16, criterion="ce x20", init_scale=2.0**8, clip=0.25),
    fixed_step(n=3, dtype=FP16, criterion="ce x20", init_scale=2.0**8, clip=3.0),
    fixed_step(n=5, dtype=FP16, criterion="ce x20", init_scale=2.0**24, clip=0.5)])


def _amp_call(fn: Callable, run: Run, b: tuple) -> Any:
    return fn(run.model, b[0], b[1], run.opt, run.criterion, run.s["dtype"])


def _fp16_call(fn: Callable, run: Run, b: tuple) -> Any:
    return fn(run.model, b[0], b[1], run.opt, run.criterion, run.scaler)


def _true_norm(run: Run, b: tuple) -> float:
    """The gradient norm of the first step, unscaled, on a copy of the run's model (the same dropout draw)."""
    model = copy.deepcopy(run.model)
    torch.manual_seed(1000)
    with torch.autocast(device_type="cpu", dtype=torch.float16):
        loss = run.criterion(model(b[0]), b[1])
    loss.backward()
    torch.manual_seed(1000)
    return _grad_norm(model.parameters())


def _clip_call(fn: Callable, run: Run, b: tuple) -> Any:
    if not hasattr(run, "max_norm"):
        run.max_norm = run.s["clip"] * _true_norm(run, b)
    return fn(run.model, b[0], b[1], run.opt, run.criterion, run.scaler, run.max_norm)


def _forward_dtype(dtype: torch.dtype) -> Callable:
    """An inspection: every forward of the student's run ran under autocast in ``dtype`` (a certain signature)."""
    def inspect(case, run: Run) -> None:
        for seen in run.seen:
            expect(seen["autocast"] and seen["dtype"] == dtype,
                   f"with {case.label}: the forward ran "
                   + (f"under autocast in {seen['dtype']}" if seen["autocast"] else "without autocast")
                   + f", expected autocast in {dtype}")
    return inspect


def generated_amp(train_step_amp: Callable) -> int:
    def inspect(case, run: Run) -> None:
        _forward_dtype(case.kwargs["spec"]["dtype"])(case, run)
    return expect_same_steps(AMP_CASES, train_step_amp, reference_amp, _amp_call, inspect)


def generated_fp16(train_step_fp16: Callable) -> int:
    return expect_same_steps(FP16_CASES, train_step_fp16, reference_fp16, _fp16_call, _forward_dtype(FP16))


def generated_fp16_clip(train_step_fp16_clip: Callable) -> int:
    return expect_same_steps(CLIP_CASES, train_step_fp16_clip, reference_fp16_clip, _clip_call, _forward_dtype(FP16))
