"""Measuring the bytes held by tensors, op by op, on any device (:class:`TensorMemoryTracker`): what the tests check
the calculator's estimates against."""
from __future__ import annotations

import weakref
from typing import Any, Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class TensorMemoryTracker(TorchDispatchMode):
    """Peak bytes held by tensors while the ``with`` block runs, counted op by op; any device.

    Why not RSS? On the CPU there is no ``max_memory_allocated``, and the resident set size (what
    :class:`dlo.measure.bench.PeakMemory` samples) includes the interpreter and libraries, is sampled every few ms
    (short peaks are missed) and depends on how malloc returns memory to the OS. Here, every ATen operator
    call goes through ``__torch_dispatch__``; each *new* storage among its outputs is added to the live
    total, and removed when the storage is freed (a ``weakref.finalize`` on the storage). The count is
    deterministic: the same steps give the same peak, to the byte.

    Tensors that exist before the block (weights, optimizer states) must be registered: pass modules
    (parameters, buffers, gradients), optimizers (their state tensors) or tensors. Not counted: buffers
    allocated *inside* one kernel (e.g. oneDNN scratch space), allocator caching and fragmentation (the
    CUDA caching allocator reserves more than tensors use), and the Python process itself.
    ``peak_op`` names the operator whose outputs made the peak.
    """

    def __init__(self, *objects: Any) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self._finalizers: list[weakref.finalize] = []
        self.current_bytes = 0
        self.peak_bytes = 0
        self.peak_op: str | None = None
        for obj in objects:
            self.register(obj)
        self.baseline_bytes = self.current_bytes

    def register(self, obj: Any) -> None:
        """Count a tensor, the parameters/buffers/gradients of a module, or an optimizer's state."""
        if isinstance(obj, torch.Tensor):
            self._add(obj)
        elif isinstance(obj, torch.nn.Module):
            for t in list(obj.parameters()) + list(obj.buffers()):
                self._add(t)
                if t.grad is not None:
                    self._add(t.grad)
        elif isinstance(obj, torch.optim.Optimizer):
            for state in obj.state.values():
                for v in state.values():
                    if isinstance(v, torch.Tensor):
                        self._add(v)
        elif isinstance(obj, Iterable):
            for x in obj:
                self.register(x)
        else:
            raise TypeError(f"cannot register {type(obj).__name__}: give tensors, modules or optimizers")

    def _add(self, t: torch.Tensor, op: str | None = None) -> None:
        if t.device.type == "meta":
            return
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        key = id(storage)  # storages keep their Python object while alive, so the id is stable
        if nbytes == 0 or key in self._live:
            return
        self._live[key] = nbytes
        self.current_bytes += nbytes
        self._finalizers.append(weakref.finalize(storage, self._free, key))
        if self.current_bytes > self.peak_bytes:
            self.peak_bytes, self.peak_op = self.current_bytes, op

    def _free(self, key: int) -> None:
        self.current_bytes -= self._live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self._add(t, str(func))
        return out

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for f in self._finalizers:  # stop counting: the tracker must not outlive its block
            f.detach()
        self._finalizers.clear()
