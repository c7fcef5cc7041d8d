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
``import torchvision`` work with a CPU-only torch (see ``dlo.runtime.compat``).
"""
from __future__ import annotations

from dlo.runtime.paths import setup_caches as _setup_caches

_setup_caches()

from dlo.runtime.compat import ensure_torchvision as _ensure_torchvision  # noqa: E402

_ensure_torchvision()

__version__ = "0.1.0"
