"""Checkers of Jour1/jour1.ipynb, registered here in the notebook's order.

Every step is judged on generated cases against a reference: device, cudnn and compile here; the mixed-precision
steps (amp, fp16, fp16_clip) in jour1_precision.py, evaluate and channels_last in jour1_models.py, batch_sweep and
profiler in jour1_tools.py, the timer in jour1_timer.py; the cases and models they share in jour1_cases.py.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks import jour1_cases, jour1_models, jour1_precision, jour1_tools
from dlo.course.checks.cases import compare
from dlo.course.checks.framework import expect, register
from dlo.course.checks.jour1_probes import backend_name, compile_context, compiled_call, traces_only


# --------------------------------------------------------------------------------------------------
# Jour1
# --------------------------------------------------------------------------------------------------

J1 = "Jour1/jour1.ipynb"


class _MoveSpy:
    """Stands for a tensor: records where each .to / .cuda / .cpu call asked it to go, and whether non_blocking."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, bool]] = []

    def to(self, *args: Any, **kwargs: Any) -> "_MoveSpy":
        target = kwargs.get("device", args[0] if args and not isinstance(args[0], torch.dtype) else None)
        self.calls.append((target, kwargs.get("non_blocking", len(args) > 1 and args[1] is True)))
        return self

    def cuda(self, device: Any = None, non_blocking: bool = False, **kwargs: Any) -> "_MoveSpy":
        self.calls.append((torch.device("cuda", device) if isinstance(device, int) else (device or "cuda"),
                           non_blocking))
        return self

    def cpu(self, **kwargs: Any) -> "_MoveSpy":
        self.calls.append(("cpu", False))
        return self


#: the spies move nothing, so any device can be asked for: a GPU index other than 0 shows a device chosen inside
#: the function, a device without an index one rebuilt from its type
DEVICE_CASES = (torch.device("cuda", 1), torch.device("cpu"), torch.device("cuda", 0), torch.device("cuda", 3))
#: (images dtype, labels dtype, batch): the real tensors moved to the CPU must come back unchanged
TENSOR_CASES = ((torch.float32, torch.int64, 8), (torch.uint8, torch.int64, 1), (torch.bfloat16, torch.int32, 3))


def _moved_once(name: str, spy: _MoveSpy, device: torch.device) -> None:
    expect(len(spy.calls) >= 1, f"with device {device}: {name} were not moved: they stay where the loader left them")
    expect(len(spy.calls) == 1,
           f"with device {device}: {name} were copied {len(spy.calls)} times: move them exactly once per batch")
    target, non_blocking = spy.calls[0]
    expect(target is not None and torch.device(target) == device,
           f"move {name} to the given device: asked for {device}, they went to {target}")
    expect(non_blocking is True,
           f"{name} are copied synchronously (non_blocking not set): the CPU waits for each copy instead of "
           "queueing it while the GPU computes")


@register("jour1", "device", ("to_device",), J1)
def _check_to_device(to_device: Callable) -> str:
    for device in DEVICE_CASES:
        images, labels = _MoveSpy(), _MoveSpy()
        out = to_device(images, labels, device)
        expect(isinstance(out, tuple) and len(out) == 2,
               f"return the pair (images, labels) as a tuple, got {type(out).__name__}")
        for name, spy in (("images", images), ("labels", labels)):
            _moved_once(name, spy, device)
    for dtype, label_dtype, n in TENSOR_CASES:
        g = torch.Generator().manual_seed(n)
        x = (torch.rand(n, 3, 4, 4, generator=g) * 255).to(dtype)
        y = torch.randint(0, 10, (n,), generator=g).to(label_dtype)
        got = to_device(x.clone(), y.clone(), torch.device("cpu"))
        problem = compare(tuple(got) if isinstance(got, (tuple, list)) else got, (x, y), "(images, labels)")
        expect(problem is None, f"with {dtype} images and {label_dtype} labels, batch {n}, moved to the CPU: "
                                f"{problem}: moving must not change the tensors' values or dtypes")
    return "both tensors are moved once with .to(device, non_blocking=True), to the device given, values unchanged"


@register("jour1", "amp", ("train_step_amp",), J1)
def _check_amp(train_step_amp: Callable) -> str:
    return jour1_precision.check_amp(train_step_amp)


@register("jour1", "fp16", ("train_step_fp16",), J1)
def _check_fp16(train_step_fp16: Callable) -> str:
    return jour1_precision.check_fp16(train_step_fp16)


@register("jour1", "fp16_clip", ("train_step_fp16_clip",), J1)
def _check_fp16_clip(train_step_fp16_clip: Callable) -> str:
    return jour1_precision.check_fp16_clip(train_step_fp16_clip)


@register("jour1", "channels_last", ("to_channels_last",), J1)
def _check_channels_last(to_channels_last: Callable) -> str:
    return jour1_models.check_channels_last(to_channels_last)


#: cuDNN's flags before the call: benchmark off and on (a toggle turns it off), with the other flags at both values
CUDNN_CASES = [{"benchmark": False, "deterministic": False}, {"benchmark": True, "deterministic": False},
               {"benchmark": False, "deterministic": True}, {"benchmark": True, "deterministic": True}]


@register("jour1", "cudnn", ("enable_cudnn_benchmark",), J1)
def _check_cudnn(enable_cudnn_benchmark: Callable) -> str:
    cudnn = torch.backends.cudnn
    old = {k: getattr(cudnn, k) for k in ("benchmark", "deterministic", "enabled", "benchmark_limit")}
    try:
        for case in CUDNN_CASES:
            for k, v in {**old, **case, "enabled": True}.items():
                setattr(cudnn, k, v)
            before = {k: getattr(cudnn, k) for k in old}
            label = ", ".join(f"{k}={v}" for k, v in case.items())
            enable_cudnn_benchmark()
            expect(cudnn.benchmark is True,
                   f"with cudnn {label} before the call: after your function cuDNN's benchmark flag is off: the "
                   "autotuner never runs " + ("(it was on, and your function turned it off: set it to True whatever it "
                                              "was)" if before["benchmark"] else
                                              "(a flag set only inside a block, or a neighbouring setting, does not "
                                              "stay on)"))
            changed = [f"{k} from {before[k]} to {getattr(cudnn, k)}" for k in old
                       if k != "benchmark" and getattr(cudnn, k) != before[k]]
            expect(not changed, f"with cudnn {label} before the call: your function also changed "
                                f"{changed[0] if changed else ''}: turn on the benchmark flag and leave the other "
                                "settings as they are")
    finally:
        for k, v in old.items():
            setattr(cudnn, k, v)
    return (f"cuDNN will time its convolution algorithms on the first call of each shape and keep the fastest "
            f"(benchmark on from {len(CUDNN_CASES)} starting states, the other flags untouched)")


def _compiled_target(compiled: Any) -> tuple[nn.Module, Any]:
    """The module a compiled answer wraps, and the name of the backend it compiles with (None if unknown)."""
    expect(compiled is not None, "your function returned None: return the compiled model")
    expect(not isinstance(compiled, torch.jit.ScriptModule),
           "this is TorchScript (torch.jit), not torch.compile: TorchScript does not fuse operations with Inductor")
    expect(isinstance(compiled, nn.Module),
           f"what you returned is a {type(compiled).__name__}, not the model: compile the module itself (it keeps "
           "its parameters, .train() and .eval())")
    if isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule):
        return compiled._orig_mod, backend_name(compiled.dynamo_ctx)
    call = compiled_call(compiled)
    expect(call is not None, "the model you returned is not compiled: calling it runs eagerly (neither the "
                             "module nor its forward goes through torch.compile)")
    original = call._torchdynamo_orig_callable
    target = compiled if getattr(original, "__self__", compiled) is compiled else original.__self__
    return target, backend_name(compile_context(call))


#: (model kind, width, BatchNorm, Dropout, given in train mode): the models compile_model is given
COMPILE_CASES = [("conv", 4, True, False, True), ("linear", 8, False, True, True), ("conv", 3, False, True, False),
                 ("linear", 5, True, False, False)]


@register("jour1", "compile", ("compile_model",), J1)
def _check_compile(compile_model: Callable) -> str:
    for kind, width, norm, dropout, train in COMPILE_CASES:
        label = (f"with a {kind} model of width {width}{' with BatchNorm' if norm else ''}"
                 f"{' with Dropout' if dropout else ''} in {'train' if train else 'eval'} mode")
        model = jour1_cases.make_model(kind, width, norm, dropout, seed=width)
        model.train(train)
        params = list(model.parameters())
        compiled = compile_model(model)
        target, backend = _compiled_target(compiled)
        expect(target is model, f"{label}: you compiled another module than the one given: calling what you "
                                "returned does not run the given model, whose parameters the optimizer updates")
        # the backend: only Inductor generates fused kernels ('eager' and 'aot_eager' trace and run the same kernels)
        expect(not traces_only(backend), f"the backend you chose ({backend!r}) only traces the model and runs the "
                                         "same eager kernels: it generates no fused kernel; keep the default backend")
        expect(model.training == train, f"{label}: after compile_model the model is in "
                                        f"{'train' if model.training else 'eval'} mode: compiling must leave the "
                                        "mode as it was (training goes on after it)")
        expect([p for p in compiled.parameters()] == params and all(a is b for a, b in zip(compiled.parameters(), params)),
               f"{label}: the compiled model's parameters are not the given model's")
    return (f"torch.compile wraps the given model (its parameters and mode kept) with a backend that generates "
            f"kernels, on {len(COMPILE_CASES)} models; compilation happens lazily at the first call")


@register("jour1", "batch_sweep", ("largest_batch",), J1)
def _check_batch_sweep(largest_batch: Callable) -> str:
    return jour1_tools.check_batch_sweep(largest_batch)


@register("jour1", "profiler", ("profile_steps",), J1)
def _check_profiler(profile_steps: Callable) -> str:
    return jour1_tools.check_profiler(profile_steps)


@register("jour1", "evaluate", ("evaluate_fast",), J1)
def _check_evaluate(evaluate_fast: Callable) -> str:
    return jour1_models.check_evaluate(evaluate_fast)

import dlo.course.checks.jour1_timer  # noqa: E402,F401  (the step timer's checker, registered after the steps above)
