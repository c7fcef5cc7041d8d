"""Checkers of Jour1/jour1.ipynb.
"""
from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from dlo.course.checks import jour1_models, jour1_precision, jour1_tools
from dlo.course.checks.framework import CheckFailed, expect, register
from dlo.course.checks.jour1_cases import Recorder as _Recorder, small_batch as _batch
from dlo.course.checks.jour1_probes import backend_config, compiled_call, explain_not_channels_last


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
    return jour1_tools.check_batch_sweep(largest_batch)


@register("jour1", "profiler", ("profile_steps",), J1)
def _check_profiler(profile_steps: Callable) -> str:
    return jour1_tools.check_profiler(profile_steps)


@register("jour1", "evaluate", ("evaluate_fast",), J1)
def _check_evaluate(evaluate_fast: Callable) -> str:
    return jour1_models.check_evaluate(evaluate_fast)

import dlo.course.checks.jour1_timer  # noqa: E402,F401  (the step timer's checker, registered after the steps above)
