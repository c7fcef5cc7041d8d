"""Makes this Python look like a GPU node's bare one: the Jupyter stack cannot be imported.

A GPU node may have torch, torchvision, transformers, pandas, matplotlib and tqdm, and no IPython, ipykernel,
nbformat, papermill or Jupyter. Tests put this folder first on PYTHONPATH (``conftest.bare_node_env``), so that
Python imports this file at start-up and every import of those packages fails as it would there
(ModuleNotFoundError), whatever the test venv has installed. ``dlo run --engine plain`` must then still run every
notebook.
"""
import sys

BLOCKED = frozenset({"IPython", "ipykernel", "ipywidgets", "nbformat", "nbclient", "nbconvert", "papermill",
                     "notebook", "traitlets", "comm", "widgetsnbextension"})


class _NotOnAGpuNode:
    """A meta-path finder that refuses the blocked packages (and every ``jupyter*`` one) before any other finder."""

    @staticmethod
    def find_spec(name, path=None, target=None):
        top = name.partition(".")[0]
        if top in BLOCKED or top.startswith("jupyter"):
            raise ModuleNotFoundError(f"No module named {name!r} (not on a GPU node: tests/bare_node)", name=name)
        return None


sys.meta_path.insert(0, _NotOnAGpuNode())
