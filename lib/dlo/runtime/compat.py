"""Make ``import torchvision`` work with a CPU build of torch.

The PyPI wheel of torchvision 0.28 is built against CUDA. With the CPU build of torch its C extension
(``torchvision/_C.so``) cannot load, and ``import torchvision`` then dies with "operator torchvision::nms
does not exist" while registering fake kernels for ``nms``/``qnms``. When (and only when) the extension
cannot load, we declare those two operator schemas ourselves before torchvision is imported. Everything
the course uses (datasets, transforms.v2, models) then works; ``torchvision.ops.nms`` and
``torchvision.io`` stay unavailable, so images are decoded with PIL.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_LIB = None  # keep the torch.library.Library alive (dropping it unregisters the schemas)
SHIMMED = False  # True when the schemas were declared here (torchvision's C ops are unavailable)


def _op_exists(name: str) -> bool:
    try:
        getattr(torch.ops.torchvision, name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _extension_loads() -> bool:
    spec = importlib.util.find_spec("torchvision")
    if spec is None or spec.origin is None:
        return True  # not installed: nothing to patch, the import error will speak for itself
    for lib in sorted(Path(spec.origin).parent.glob("_C*.so")) + sorted(Path(spec.origin).parent.glob("_C*.pyd")):
        try:
            torch.ops.load_library(str(lib))
            return True
        except (OSError, ImportError, RuntimeError):
            return False
    return False


def ensure_torchvision() -> bool:
    """Prepare for ``import torchvision``. Returns True if the op schemas had to be declared here."""
    global _LIB, SHIMMED
    if "torchvision" in sys.modules or SHIMMED:
        return SHIMMED
    if all(_op_exists(n) for n in _SCHEMAS) or _extension_loads():
        return False
    _LIB = torch.library.Library("torchvision", "DEF")  # noqa: TOR901 - we own these two schemas only
    for name, schema in _SCHEMAS.items():
        if not _op_exists(name):
            _LIB.define(schema)
    SHIMMED = True
    return True


def import_deepspeed():
    """``import deepspeed``, set up to compile nothing on a CPU-only machine.

    DeepSpeed's communication backend JIT-compiles a shared-memory collective in C++ the first time it starts
    on a CPU (about 2 minutes on 2 cores, and a compiler must be there), even when given a plain torch
    optimizer. Marking that op incompatible makes DeepSpeed keep torch's gloo collectives instead.
    """
    import deepspeed

    if not torch.cuda.is_available():
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # DeepSpeed reads this dict before building it
    return deepspeed
