"""dlo: the helper package of the "Deep Learning Optimisé" workbook.

Importing it points the torch / matplotlib caches into the project's ``.cache/`` folder and makes
``import torchvision`` work with a CPU-only torch (see ``dlo._compat``).
"""
from __future__ import annotations

from .paths import setup_caches as _setup_caches

_setup_caches()

from ._compat import ensure_torchvision as _ensure_torchvision  # noqa: E402

_ensure_torchvision()

__version__ = "0.1.0"
