"""dlo: the helper package of the "Deep Learning Optimisé" workbook.

Its folders are layers, lowest first; a module imports only from its own layer or the layers below
(``tests/test_layers.py`` keeps it so):

- ``runtime``: device, distributed context and process groups, launcher, records, paths, Slurm templates;
- ``data``: CIFAR-10 (real or generated in the same format), loaders, token streams, MixUp/CutMix;
- ``models``: CIFAR ResNets, the lessons' small nets, a Llama-style decoder and its configurations;
- ``measure``: timing with warm-up until steady, memory and FLOPs calculators, roofline, plots;
- ``training``: one config, one step, ONE loop with callbacks, optimizers, checkpoints, tracking;
- ``parallel``: from-scratch DDP, tensor, pipeline parallelism and the FSDP/ZeRO helpers;
- ``lessons``: thin helpers of single notebooks (race, HPO, inference, JIT, LR finder, loader profiling);
- ``course``: notebook runner, student copies, nbval plugin, exercise checkers;
- ``cli``: the ``dlo`` command.

Importing it points the torch / matplotlib caches into the project's ``.cache/`` folder and makes
``import torchvision`` work with a CPU-only torch (see ``dlo.runtime.compat``; done just before torchvision is
first imported, so that ``import dlo`` itself does not import torch).
"""
from __future__ import annotations

import sys

from dlo.runtime.paths import setup_caches as _setup_caches

_setup_caches()


class _TorchvisionHook:
    """Runs ``dlo.runtime.compat.ensure_torchvision()`` just before torchvision is first imported, then steps aside.

    The shim needs torch (seconds to import); calling it here instead of on ``import dlo`` keeps the commands that
    never touch torchvision (``dlo hint``, ``dlo --help``) fast. It must still run before torchvision's own
    ``__init__``: a meta path finder is asked first, for the top-level name, before anything is loaded.
    A meta path finder only needs ``find_spec``; subclassing ``importlib.abc.MetaPathFinder`` would import
    ``importlib.resources``, ``zipfile`` and ``tempfile`` (some 30 ms) on every ``import dlo``.
    """

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torchvision":
            _remove_hook(self)  # first: the shim itself looks torchvision up (importlib.util.find_spec)
            from dlo.runtime.compat import ensure_torchvision

            ensure_torchvision()
        return None  # the usual finders do the import


def _remove_hook(hook: _TorchvisionHook) -> None:
    try:
        sys.meta_path.remove(hook)
    except ValueError:  # already removed (two threads got there at once)
        pass


if "torchvision" in sys.modules:  # too late for the hook: compat handles this case itself
    from dlo.runtime.compat import ensure_torchvision as _ensure_torchvision

    _ensure_torchvision()
elif not any(isinstance(f, _TorchvisionHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _TorchvisionHook())

__version__ = "0.1.0"
