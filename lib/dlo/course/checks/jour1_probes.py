"""What a Jour 1 answer did, seen from outside: the autocasts it entered (jour1/amp), and what calling a model it
compiled goes through (jour1/compile: an OptimizedModule, Module.compile() in place, or a compiled forward), and how images returned
by jour1/channels_last are laid out."""
from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch import nn

from dlo.course.checks.framework import expect


class AutocastSpy:
    """Records the (device_type, enabled) of every torch.autocast created while installed (torch.amp.autocast and
    the per-device aliases are that class or subclasses of it)."""

    def __enter__(self) -> list[tuple[str, bool]]:
        cls = torch.amp.autocast_mode.autocast
        self.real, self.entered = cls.__init__, []
        real, entered = self.real, self.entered

        def init(this, device_type: str, *args: Any, **kwargs: Any) -> None:
            enabled = kwargs.get("enabled", args[1] if len(args) > 1 else True)
            entered.append((str(device_type), bool(enabled)))
            with warnings.catch_warnings():  # CUDA autocast on a machine without CUDA: the message says it better
                warnings.filterwarnings("ignore", message=".*CUDA is not available.*")
                real(this, device_type, *args, **kwargs)

        cls.__init__ = init
        return self.entered

    def __exit__(self, *exc: Any) -> None:
        torch.amp.autocast_mode.autocast.__init__ = self.real


def explain_no_autocast(entered: list[tuple[str, bool]], device: str) -> None:
    """The forward ran without autocast on the batch's device: say what the answer did instead (always raises)."""
    others = sorted({d for d, _ in entered if d != device})
    expect(not others,
           f"the batch is on {device}, but the autocast you entered is for device_type={others[0]!r}: autocast only "
           f"changes the operations of the device type it is given, so the forward ran in float32 on {device}; take "
           "the device type from the images" if others else "")
    expect(not any(d == device and not on for d, on in entered),
           f"the autocast you entered for {device} was disabled (enabled=False): the forward ran in float32")
    expect(not entered, f"an autocast for {device} was created, but the forward pass ran outside it: call the model "
                        "inside the with block")
    expect(False, "the forward pass ran without autocast: run it inside torch.autocast(device_type=..., dtype=dtype)")


def compiled_call(module: nn.Module) -> Any:
    """What calling ``module`` goes through when it was compiled in place: Module.compile()'s compiled call, or a
    compiled function put in place of its forward (``model.forward = torch.compile(model.forward)``); else None."""
    for fn in (getattr(module, "_compiled_call_impl", None), module.__dict__.get("forward")):
        if fn is not None and hasattr(fn, "_torchdynamo_orig_callable"):
            return fn
    return None


def compile_context(fn: Any) -> Any:
    """The torch.compile context of a compiled function (its closure's ``self``), or None."""
    return inspect.getclosurevars(fn).nonlocals.get("self")


def backend_name(ctx: Any) -> str | None:
    """The name of the backend a torch.compile context compiles with ('inductor', 'eager', 'aot_eager', ...),
    found along the wrappers' ``_torchdynamo_orig_backend`` chain; None when it cannot be read."""
    obj = getattr(ctx, "callback", None)
    for _ in range(8):
        if obj is None:
            return None
        name = getattr(obj, "_compiler_name", None) or getattr(obj, "compiler_name", None)
        if isinstance(name, str):
            return name
        obj = getattr(obj, "_torchdynamo_orig_backend", None)
    return None


def traces_only(name: str | None) -> bool:
    """Whether a backend only traces the model and runs the same eager kernels (no generated, fused kernel)."""
    return bool(name) and (name.startswith("eager") or name.startswith("aot_eager"))


def explain_not_channels_last(x: torch.Tensor, x2: torch.Tensor) -> None:
    """The images ``x2`` returned for ``x`` are not channels_last: say what they are (always raises)."""
    nhwc = x.contiguous(memory_format=torch.channels_last).stride()
    expect(x2.data_ptr() != x.data_ptr(),
           f"the images returned are the given ones, in the same memory (strides {x2.stride()}, channels_last has "
           f"{nhwc}): convert the images too, and keep what the conversion returns (a tensor's conversion returns a "
           "new tensor, unlike a module's, which converts the model in place)")
    expect(False, f"the images returned are a new tensor, not laid out channels_last in memory (strides "
                  f"{x2.stride()}, channels_last has {nhwc})"
           + (": return the converted tensor as it is (a plain .contiguous() after the conversion, or a copy "
              "that does not keep the memory format, lays it out NCHW again)" if x2.is_contiguous() else ""))
