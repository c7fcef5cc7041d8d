"""Exercise checkers: each one calls the student's function on small inputs and checks its *behaviour*.

In a notebook, the cell after an exercise runs ``check("jour1", "amp", globals())``: it prints a line
starting with "PASSED" or raises :class:`CheckFailed` with a hint. From a terminal,
``dlo check jour1 amp`` loads the exercise cells of the student notebook (cells tagged ``setup`` and
``exercise``) and runs the same checker.

A checker must fail on the generated stub (which raises NotImplementedError) and pass on the solution;
tests/test_checks.py verifies both for every step.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from .paths import ROOT


class CheckFailed(AssertionError):
    """The answer is not right yet; the message says what was expected."""


@dataclass(frozen=True)
class Check:
    course: str
    step: str
    functions: tuple[str, ...]
    run: Callable[..., str]
    notebook: str  # source notebook, relative to the project root

    @property
    def student_notebook(self) -> Path:
        src = ROOT / self.notebook
        return src.parent / "student" / src.name


REGISTRY: dict[str, dict[str, Check]] = {}


def register(course: str, step: str, functions: tuple[str, ...], notebook: str):
    def deco(fn: Callable[..., str]) -> Callable[..., str]:
        REGISTRY.setdefault(course, {})[step] = Check(course, step, functions, fn, notebook)
        return fn

    return deco


def _expect(cond: bool, message: str) -> None:
    if not cond:
        raise CheckFailed(message)


def check(course: str, step: str, namespace: dict[str, Any] | None = None, **functions: Callable) -> str:
    """Run the checker of ``course``/``step`` on functions found in ``namespace`` (e.g. ``globals()``)."""
    if course not in REGISTRY:
        raise ValueError(f"unknown course {course!r}: choose one of {', '.join(sorted(REGISTRY))}")
    if step not in REGISTRY[course]:
        raise ValueError(f"unknown step {step!r} for {course}: choose one of {', '.join(REGISTRY[course])}")
    chk = REGISTRY[course][step]
    ns = dict(namespace or {}, **functions)
    missing = [f for f in chk.functions if f not in ns]
    if missing:
        raise CheckFailed(f"{course}/{step}: define {', '.join(missing)} first (run its exercise cell)")
    try:  # the student's prints on the checker's fake inputs (e.g. simulated OOMs) would only confuse
        with contextlib.redirect_stdout(io.StringIO()):
            detail = chk.run(*(ns[f] for f in chk.functions))
    except NotImplementedError as exc:
        raise CheckFailed(f"{course}/{step}: not implemented yet -- {exc}") from None
    except CheckFailed as exc:
        raise CheckFailed(f"{course}/{step}: {exc}") from None
    message = f"PASSED {course}/{step}: {detail}"
    print(message)
    return message


def load_exercises(notebook: str | os.PathLike) -> dict[str, Any]:
    """Execute a notebook's ``setup`` and ``exercise`` cells (imports and function definitions only).

    A course script (``.py``) is executed whole as a module named ``__exercises__``: its
    ``if __name__ == "__main__":`` part does not run, so only its imports and definitions happen.
    """
    if Path(notebook).suffix == ".py":
        path = Path(notebook).resolve()  # checkers may start processes that import the same file
        ns = {"__name__": "__exercises__", "__file__": str(path)}
        exec(compile(path.read_text(), str(path), "exec"), ns)  # noqa: S102 - course code
        return ns
    nb = json.loads(Path(notebook).read_text())
    ns: dict[str, Any] = {"__name__": "__exercises__"}
    for cell in nb["cells"]:
        tags = cell.get("metadata", {}).get("tags", [])
        if cell["cell_type"] == "code" and ({"setup", "exercise"} & set(tags)):
            src = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
            exec(compile(src, f"{Path(notebook).name}:{tags}", "exec"), ns)  # noqa: S102 - course code
    return ns


def check_notebook(course: str, step: str, notebook: str | os.PathLike | None = None) -> str:
    """``dlo check``: run a step's checker on the exercise cells of a notebook (default: the student one)."""
    if course not in REGISTRY or step not in REGISTRY[course]:
        return check(course, step, {})  # raises the one-line "unknown ..." error
    path = Path(notebook) if notebook else REGISTRY[course][step].student_notebook
    if not path.is_file():
        raise FileNotFoundError(f"no notebook or script at {path}: run `make student` or pass --notebook PATH")
    return check(course, step, load_exercises(path))


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
    _expect(isinstance(out, tuple) and len(out) == 2, "return the pair (images, labels)")
    for name, spy in (("images", images), ("labels", labels)):
        _expect(len(spy.calls) == 1, f"call {name}.to(...) exactly once")
        args, kwargs = spy.calls[0]
        target = args[0] if args else kwargs.get("device")
        _expect(target is not None and torch.device(target) == device, f"move {name} to the given device")
        _expect(kwargs.get("non_blocking") is True,
                f"pass non_blocking=True to {name}.to(): with pinned memory the copy then overlaps GPU work")
    x, y = _batch()
    x2, y2 = to_device(x, y, device)
    _expect(torch.equal(x2, x) and torch.equal(y2, y), "the tensors' values must not change")
    return "both tensors are moved with .to(device, non_blocking=True)"


@register("jour1", "amp", ("train_step_amp",), J1)
def _check_amp(train_step_amp: Callable) -> str:
    torch.manual_seed(0)
    model = _Recorder()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = _snapshot(model)
    x, y = _batch()
    loss = train_step_amp(model, x, y, opt, nn.CrossEntropyLoss(), torch.bfloat16)
    _expect(bool(model.seen), "call the model on the images")
    seen = model.seen[-1]
    _expect(seen["autocast"], "run the forward pass inside torch.autocast(device_type=..., dtype=dtype)")
    _expect(seen["dtype"] == torch.bfloat16, f"autocast must use the dtype argument (bf16 here), got {seen['dtype']}")
    _expect(isinstance(loss, torch.Tensor) and loss.ndim == 0, "return the loss as a 0-d tensor (no .item())")
    _expect(loss.dtype == torch.float32, "the loss should be float32 (autocast runs cross-entropy in fp32)")
    _expect(_params_changed(model, before), "do the backward pass and the optimizer step (parameters did not change)")
    _expect(all(p.grad is None or p.grad.dtype == torch.float32 for p in model.parameters()),
            "gradients of fp32 parameters must stay fp32: only the forward runs under autocast")
    return "forward under bf16 autocast, fp32 loss and gradients, parameters updated"


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
    loss = train_step_fp16(model, x, y, opt, nn.CrossEntropyLoss(), scaler)
    _expect(bool(model.seen) and model.seen[-1]["autocast"] and model.seen[-1]["dtype"] == torch.float16,
            "run the forward pass inside torch.autocast(..., dtype=torch.float16)")
    _expect(calls[:1] == ["scale"], "call scaler.scale(loss).backward() instead of loss.backward()")
    _expect("step" in calls and "update" in calls and calls.index("step") < calls.index("update"),
            "then scaler.step(optimizer) (not optimizer.step()) and scaler.update(), in that order")
    _expect(isinstance(loss, torch.Tensor), "return the (unscaled) loss tensor")
    _expect(_params_changed(model, before), "the optimizer step did not change the parameters")
    return "fp16 autocast, scaled backward, scaler.step then scaler.update"


@register("jour1", "channels_last", ("to_channels_last",), J1)
def _check_channels_last(to_channels_last: Callable) -> str:
    model = _Recorder()
    x, _ = _batch()
    out = to_channels_last(model, x)
    _expect(isinstance(out, tuple) and len(out) == 2, "return the pair (model, images)")
    m, x2 = out
    cl = torch.channels_last
    _expect(m.conv.weight.is_contiguous(memory_format=cl), "convert the model: model.to(memory_format=torch.channels_last)")
    _expect(x2.is_contiguous(memory_format=cl) and not x2.is_contiguous(),
            "convert the images too: images.contiguous(memory_format=torch.channels_last)")
    _expect(torch.equal(x2, x), "the values must not change, only the layout")
    return "model weights and images are NHWC (channels_last) in memory"


@register("jour1", "cudnn", ("enable_cudnn_benchmark",), J1)
def _check_cudnn(enable_cudnn_benchmark: Callable) -> str:
    old = torch.backends.cudnn.benchmark
    try:
        torch.backends.cudnn.benchmark = False
        enable_cudnn_benchmark()
        _expect(torch.backends.cudnn.benchmark is True, "set torch.backends.cudnn.benchmark = True")
    finally:
        torch.backends.cudnn.benchmark = old
    return "cuDNN will time its convolution algorithms on the first call of each shape and keep the fastest"


@register("jour1", "compile", ("compile_model",), J1)
def _check_compile(compile_model: Callable) -> str:
    model = _Recorder()
    compiled = compile_model(model)
    _expect(isinstance(compiled, torch._dynamo.eval_frame.OptimizedModule),
            "return torch.compile(model) (an OptimizedModule wrapping the model)")
    _expect(getattr(compiled, "_orig_mod", None) is model, "compile the model you were given")
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
    _expect(best == 64, f"the largest batch that fits is 64 here, got {best!r}")
    _expect(tried == [16, 32, 64, 128], f"stop at the first out-of-memory error (tried {tried})")
    _expect(isinstance(results, list) and [r["batch_size"] for r in results] == [16, 32, 64],
            "return the results of the batches that fitted, in order")
    best_none, res_none = largest_batch(lambda bs: (_ for _ in ()).throw(torch.OutOfMemoryError("oom")), [8])
    _expect(best_none is None and res_none == [], "when nothing fits, return (None, [])")
    other = None
    try:
        largest_batch(lambda bs: (_ for _ in ()).throw(ValueError("a real bug")), [8])
    except ValueError as exc:
        other = exc
    _expect(other is not None, "catch only torch.OutOfMemoryError: other errors are bugs and must propagate")
    return "OOM is caught (and only OOM), the sweep stops there and reports the largest batch that fit"


@register("jour1", "profiler", ("profile_steps",), J1)
def _check_profiler(profile_steps: Callable) -> str:
    model = _Recorder()
    x, y = _batch()
    calls = []

    def step() -> None:
        calls.append(1)
        nn.functional.cross_entropy(model(x), y).backward()

    with tempfile.TemporaryDirectory() as d:
        prof = profile_steps(step, d, wait=1, warmup=1, active=2)
        traces = list(Path(d).rglob("*.json"))
        _expect(len(calls) == 4, f"call step() wait + warmup + active = 4 times (called {len(calls)})")
        _expect(bool(traces), "write the trace with on_trace_ready=torch.profiler.tensorboard_trace_handler(trace_dir)")
        _expect(prof is not None and hasattr(prof, "key_averages"), "return the profiler object")
        names = {e.key for e in prof.key_averages()}
        _expect(any("conv" in n for n in names), "record the steps inside the profiler (call prof.step() after each)")
    return "trace written for TensorBoard/Perfetto with a wait/warm-up/active schedule"


@register("jour1", "evaluate", ("evaluate_fast",), J1)
def _check_evaluate(evaluate_fast: Callable) -> str:
    torch.manual_seed(0)
    model = _Recorder()
    data = [_batch(8, seed) for seed in range(3)]
    acc = evaluate_fast(model, data)
    _expect(bool(model.seen), "run the model on every batch")
    seen = model.seen[-1]
    _expect(seen["inference"] or not seen["grad"], "wrap the loop in torch.inference_mode() (or torch.no_grad())")
    _expect(not seen["training"], "call model.eval() so BatchNorm uses its running statistics")
    model.eval()
    with torch.no_grad():
        expected = sum((model(x).argmax(1) == y).sum().item() for x, y in data) / sum(len(y) for _, y in data)
    _expect(isinstance(acc, float) and abs(acc - expected) < 1e-9, f"return the accuracy as a float ({expected:.3f} here), got {acc!r}")
    return "eval mode, no autograd graph, accuracy correct"


# The other courses' checkers (``checks_*.py`` modules next to this one) register themselves on import.
def _import_course_checkers() -> None:
    import importlib
    import pkgutil

    for info in sorted(pkgutil.iter_modules([str(Path(__file__).parent)]), key=lambda m: m.name):
        if info.name.startswith("checks_"):
            importlib.import_module(f"{__package__}.{info.name}")


_import_course_checkers()
