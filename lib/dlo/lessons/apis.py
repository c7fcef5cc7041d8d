"""High-level training APIs (tp_fsdp/apis.ipynb): what native FSDP2, Hugging Face Accelerate and Lightning
Fabric do with the same small Llama, the same data, the same seed and the same optimizer.

The training loops themselves, one per API, are in ``tp_fsdp/apis_train.py`` (the lesson is how many lines
each one needs, so they are plain code there). This module holds what is measured and compared around them:

* which libraries are there (:func:`missing_library`) and which API/strategy can run on this device
  (:func:`unavailable_reason`), each as one line;
* Accelerate's YAML config (:func:`accelerate_config`, :func:`write_accelerate_config`,
  :func:`read_accelerate_config`) and its launcher (:func:`launch_accelerate`);
* per-rank measurements: :class:`StepMeter` (loss and step time of every step, peak memory),
  :func:`held_bytes` (parameter, gradient and optimizer bytes this rank holds, counted from the tensors);
* comparisons: :func:`runs_table` (step time with spread, memory, loss gap against a reference run) and its
  plot :func:`runs_plot`,
  :func:`code_lines` (lines of user code of a function);
* fp8 training with torchao (GPU only): :func:`fp8_skip_reason`, :func:`fp8_module_filter`,
  :func:`fp8_summary`, and the CUDA-only :func:`train_fp8_or_bf16`.

Accelerate, Lightning Fabric and torchao are imported inside the functions that use them: this module (and
the notebook's other cells) still import on a machine that lacks them.
"""
from __future__ import annotations

from dlo.lessons.apis_core import (  # noqa: F401
    MODELS, API_STRATEGIES, LIBRARIES, PINS, missing_library, unavailable_reason, accelerate_config,
    write_accelerate_config, read_accelerate_config, StepMeter, held_bytes, rank_mean_losses, max_relative_gap,
    runs_table, runs_plot, code_lines, resolved_config, dump,
)
from dlo.lessons.apis_fp8 import (FP8_MIN_CAPABILITY, fp8_module_filter, fp8_skip_reason, fp8_summary,  # noqa: F401
                                  train_fp8_or_bf16)
from dlo.lessons.apis_launch import launch_accelerate  # noqa: F401

__all__ = ["MODELS", "API_STRATEGIES", "LIBRARIES", "PINS", "missing_library", "unavailable_reason", "accelerate_config",
           "write_accelerate_config", "read_accelerate_config", "launch_accelerate", "StepMeter", "held_bytes",
           "rank_mean_losses", "max_relative_gap", "runs_table", "runs_plot", "code_lines", "FP8_MIN_CAPABILITY",
           "fp8_skip_reason", "fp8_module_filter", "fp8_summary", "train_fp8_or_bf16", "resolved_config", "dump"]
