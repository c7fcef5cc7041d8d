"""FLOPs per token, GPU peak throughput and MFU (model FLOPs utilisation).

MFU answers "what fraction of the GPU's peak arithmetic did my training actually use?":

    MFU = (model FLOPs per token x tokens per second) / peak FLOP/s

where the peak is that of the precision the step computes in (bf16 under autocast, fp32 for a plain
fp32 step: 67 instead of 989 TFLOP/s on an H100; see :func:`gpu_peak` and :func:`mfu`'s ``dtype``).

("model" FLOPs: those the model mathematically needs, not counting recomputation from activation
checkpointing.) The *hardware* FLOPs utilisation, :func:`hfu`, counts what the GPU actually computed:
the model FLOPs plus the forward of every decoder layer that activation checkpointing runs again in
backward (:func:`hardware_flops_per_token`: full checkpointing of all L layers gives ``8N + 16·L·H·S``
instead of ``6N + 12·L·H·S``). MFU is what a run is judged by (recomputation is a cost, not work done);
HFU says how busy the GPU was. Published LLM trainings reach
roughly 35-50 % (see REFERENCES.md (repository root): Megatron-LM 41-48 % on H100, torchtitan Llama 3.1 8B
≈33-39 %); below ~20 % something (data loading, communication, small matmuls) is usually wrong.

FLOPs per token (the formula quoted in REFERENCES.md, from Kaplan et al. 2020 / PaLM appendix B):

    training:  6N + 12·L·H·S        inference (forward only):  2N + 4·L·H·S

- ``2N``: each parameter of a weight matrix does one multiply and one add per token in the forward pass;
  the backward pass costs twice the forward (gradients w.r.t. activations *and* w.r.t. weights): 6N.
- ``4·L·H·S``: attention scores ``Q·Kᵀ`` and the weighted sum ``P·V`` are matmuls *without* parameters:
  per layer and token, ``S·H`` multiply-adds each, i.e. ``2·2·S·H`` FLOPs forward, ×3 for training:
  ``12·L·H·S``. ``H`` is the width of the queries (``num_heads·head_dim``, the hidden size in Llama 3),
  ``S`` the sequence length. The convention counts the full ``S×S`` matrix; a causal model could skip
  half of it, so the term slightly overestimates for causal attention (a convention, not a bug: it keeps
  MFU numbers comparable).

Which N? By default the *non-embedding* parameters (Kaplan et al.): the input embedding is a table
lookup, no FLOPs. Note that this convention also leaves out the output head (a ``H×V`` matmul that does
cost ``2·H·V`` FLOPs per token forward: for Llama 3.2 3B, 12 % of the training FLOPs at 128 tokens, 11 % at
2,048, 8.5 % at 8,192 and 1.5 % at 131,072, since the attention term grows with S and the head's does not);
``include_head=True`` adds the head's ``V·H`` weights to N (its matmul, whether or not it shares its weights
with the input embedding): what torchtitan's and Megatron-LM's MFU figures count, so an MFU compared with theirs
must include it (``dlo.parallel.fsdp`` reports both, ``mfu`` with the head and ``mfu_no_head``).
``include_embeddings=True`` uses all the parameters instead (as PaLM and many MFU reports do; for a model with
tied embeddings this is the same as ``include_head``). Say which one you use when you report an MFU.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace

import torch

from dlo.models.config import TransformerConfig
from dlo.measure.memory import count_parameters

TERA = 10**12


def flops_per_token(model: TransformerConfig | int, seq_len: int, *, training: bool = True,
                    include_embeddings: bool = False, include_head: bool = False, num_layers: int | None = None,
                    attention_width: int | None = None) -> float:
    """Model FLOPs per token: ``6N + 12·L·H·S`` for training, ``2N + 4·L·H·S`` for a forward pass.

    ``model``: a :class:`~dlo.models.config.TransformerConfig` (N, L and H are read from it) or a parameter
    count N, then with ``num_layers`` (L) and ``attention_width`` (H, usually the hidden size) for the
    attention term, which may be left out only with ``seq_len=0``. With an int, N is used as given
    (``include_embeddings`` and ``include_head`` only apply to a config). As ``seq_len → 0`` this tends to 6N (2N).
    ``include_head``: N also counts the output head's ``vocab_size · hidden_size`` weights (its matmul's FLOPs).
    """
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative integer, got {seq_len!r}")
    if isinstance(model, TransformerConfig):
        counts = count_parameters(model)
        if include_embeddings and include_head:
            raise ValueError("include_embeddings already counts the output head: pass one of the two")
        n = counts["total"] if include_embeddings else counts["non_embedding"]
        if include_head:
            n += model.vocab_size * model.hidden_size
        layers, width = model.num_layers, model.q_dim
    else:
        if isinstance(model, bool) or not isinstance(model, int) or model < 1:
            raise ValueError(f"model must be a TransformerConfig or a positive parameter count, got {model!r}")
        n, layers, width = model, num_layers, attention_width
        if seq_len and (layers is None or width is None):
            raise ValueError("the attention term needs num_layers and attention_width (hidden size) "
                             "with a bare parameter count; or pass a TransformerConfig, or seq_len=0")
    factor = 3 if training else 1  # backward = 2 x forward
    attention = 4 * layers * width * seq_len if seq_len else 0
    return float(factor * (2 * n + attention))


def layer_forward_flops_per_token(cfg: TransformerConfig, seq_len: int) -> float:
    """FLOPs of one decoder layer's forward per token: ``2 · (layer parameters) + 4·H·S`` (its weight
    matmuls and its attention scores and weighted sum, the convention of :func:`flops_per_token`)."""
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 0:
        raise ValueError(f"seq_len must be a non-negative integer, got {seq_len!r}")
    return float(2 * count_parameters(cfg)["per_layer"] + 4 * cfg.q_dim * seq_len)


def hardware_flops_per_token(cfg: TransformerConfig, seq_len: int, *, recomputed_layers: float = 0) -> float:
    """FLOPs per token that the hardware runs in a training step: the model FLOPs (:func:`flops_per_token`)
    plus ``recomputed_layers`` decoder-layer forwards (:func:`layer_forward_flops_per_token`), the work that
    activation checkpointing does twice.

    ``recomputed_layers``: ``L`` for full checkpointing of every layer (one more forward: ``8N + 16·L·H·S``
    up to the final norm's few parameters), ``ceil(L / k)`` when one layer in ``k`` is checkpointed, ``0``
    without checkpointing or with an op-level selective policy that keeps every matmul's output (what it
    recomputes, norms and activations, are element-wise ops that FLOP conventions do not count)."""
    if not recomputed_layers >= 0 or recomputed_layers > cfg.num_layers:
        raise ValueError(f"recomputed_layers must be between 0 and the {cfg.num_layers} layers, "
                         f"got {recomputed_layers!r}")
    return flops_per_token(cfg, seq_len) + recomputed_layers * layer_forward_flops_per_token(cfg, seq_len)


#: Names of the precisions a peak is quoted for, and the spellings accepted for each.
_PRECISIONS = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
               "tf32": "tf32", "fp32": "fp32", "float32": "fp32", "float": "fp32"}


def precision_name(dtype: torch.dtype | str) -> str:
    """``"bf16"``, ``"fp16"``, ``"tf32"`` or ``"fp32"`` for a torch dtype or one of those names. TF32 is no
    torch dtype: a float32 step whose matmuls run in TF32 (``torch.backends.cuda.matmul.allow_tf32``) is
    ``"tf32"``."""
    key = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else str(dtype).lower()
    if key not in _PRECISIONS:
        raise ValueError(f"no peak is quoted for dtype {dtype!r}: use bf16, fp16, tf32 or fp32 "
                         f"(or torch.bfloat16 / torch.float16 / torch.float32)")
    return _PRECISIONS[key]


@dataclass(frozen=True)
class GpuSpec:
    """Reference figures of one accelerator (vendor datasheets, dense, no sparsity; REFERENCES.md).

    ``bf16_tflops``: dense 16-bit Tensor Core peak (fp16 for the V100, which has no bf16). These are
    *peaks*: a large bf16 matmul reaches ≈80 % of them on an H100 (≈795 of 989 TFLOP/s, REFERENCES.md).
    The fp32 peak is 15x lower on an H100: an MFU must divide by the peak of the precision the step
    actually computes in (:meth:`peak`), not by the 16-bit one.

    ``dtype``: the precision :attr:`peak_flops` refers to (16-bit for the table's entries;
    :func:`gpu_peak` with a ``dtype`` returns a copy for another one).
    """

    name: str
    bf16_tflops: float
    tf32_tflops: float | None
    fp32_tflops: float
    memory_gb: float
    hbm_tb_s: float
    note: str = ""
    dtype: str = "bf16"

    def peak(self, dtype: torch.dtype | str) -> float:
        """Dense peak in FLOP/s for computing in ``dtype`` (see :func:`precision_name`)."""
        precision = precision_name(dtype)
        if precision == "bf16" and "no bf16" in self.note:
            raise ValueError(f"the {self.name} has no bf16 Tensor Cores ({self.note}): use fp16 or fp32")
        tflops = {"bf16": self.bf16_tflops, "fp16": self.bf16_tflops, "tf32": self.tf32_tflops,
                  "fp32": self.fp32_tflops}[precision]
        if tflops is None:
            raise ValueError(f"the {self.name} has no {precision} peak (no such Tensor Core mode): use fp32")
        return tflops * TERA

    @property
    def peak_flops(self) -> float:
        """Dense peak in FLOP/s for :attr:`dtype` (the 16-bit peak for the table's entries)."""
        return self.peak(self.dtype)


#: The one table of device peaks (dense, no sparsity: the data sheets quote the 16-bit Tensor Core figure with 2:4
#: sparsity, twice these), REFERENCES.md. Every figure is the vendor's data-sheet figure (NVIDIA's product data sheets:
#: V100, A100, H100 SXM/PCIe/NVL, H200 SXM/NVL, GH200 Grace Hopper, L40S), halved where the sheet gives only the sparse
#: one; none is measured here. The NVL boards and the PCIe H100 run at lower clocks and power than the SXM parts, hence
#: their lower peaks; the GH200's GPU is an H100-class chip with the SXM's peak. The A100 40 GB and 80 GB, SXM4 and PCIe,
#: share the 16-bit peak (312); the entry's memory and bandwidth are the SXM 80 GB's. Memory sizes are those of the
#: listed variants (V100: 32 GB SXM2, a 16 GB one exists; GH200 480GB: 96 GB of HBM3 beside the CPU's LPDDR5X).
GPU_PEAKS: dict[str, GpuSpec] = {
    "V100": GpuSpec("V100 SXM2", 125.0, None, 15.7, 32, 0.9, "fp16 Tensor Core (no bf16 on Volta)", dtype="fp16"),
    "A100": GpuSpec("A100 SXM 80 GB", 312.0, 156.0, 19.5, 80, 2.0),
    "H100": GpuSpec("H100 SXM", 989.0, 494.0, 67.0, 80, 3.35),
    "H100 PCIe": GpuSpec("H100 PCIe", 756.0, 378.0, 51.0, 80, 2.0, "lower clocks and power than the SXM"),
    "H100 NVL": GpuSpec("H100 NVL", 835.0, 418.0, 60.0, 94, 3.9, "lower clocks and power than the SXM"),
    "H200": GpuSpec("H200", 989.0, 494.0, 67.0, 141, 4.8, "same compute as the H100 SXM, more and faster HBM"),
    "H200 NVL": GpuSpec("H200 NVL", 835.0, 418.0, 60.0, 141, 4.8, "lower clocks and power than the SXM"),
    "GH200": GpuSpec("GH200", 989.0, 494.0, 67.0, 96, 4.0, "Grace Hopper: an H100-class GPU beside a Grace CPU"),
    "L40S": GpuSpec("L40S", 362.0, 183.0, 91.6, 48, 0.864, "Ada, GDDR6"),
}

#: How a device name (``torch.cuda.get_device_name()``) picks its entry: the first pattern that matches, in this
#: order (the GH200 before the H200 it contains; a board's NVL/PCIe variant before its plain name). A name no pattern
#: matches (another GPU, the V100 PCIe with its own peak) has no entry: no MFU rather than a wrong one.
_NAME_PATTERNS: tuple[tuple[str, str], ...] = (
    ("GH200", r"(?<![A-Z0-9])GH200(?![0-9])"),
    ("H200 NVL", r"(?<![A-Z0-9])H200(?![0-9]).*\bNVL\b"),
    ("H200", r"(?<![A-Z0-9])H200(?![0-9])"),
    ("H100 NVL", r"(?<![A-Z0-9])H100(?![0-9]).*\bNVL\b"),
    ("H100 PCIe", r"(?<![A-Z0-9])H100(?![0-9]).*PCIE"),
    ("H100", r"(?<![A-Z0-9])H100(?![0-9])"),
    ("A100", r"(?<![A-Z0-9])A100(?![0-9])"),
    ("L40S", r"(?<![A-Z0-9])L40S(?![A-Z0-9])"),
    ("V100", r"(?<![A-Z0-9])V100(?![0-9])(?!.*PCIE)"),
)

#: What a run says where the device has no entry in :data:`GPU_PEAKS`.
UNKNOWN_GPU = "unknown GPU: no MFU"


def gpu_key(name: str | None) -> str | None:
    """The :data:`GPU_PEAKS` key of a device name as ``torch.cuda.get_device_name()`` reports it ("NVIDIA H100 80GB
    HBM3" -> "H100", "NVIDIA H100 PCIe" -> "H100 PCIe", "NVIDIA GH200 480GB" -> "GH200", "NVIDIA L40S" -> "L40S"),
    None for a name that matches no entry."""
    if not name:
        return None
    upper = name.upper()
    return next((key for key, pattern in _NAME_PATTERNS if re.search(pattern, upper)), None)


def gpu_peak(name: str | None, dtype: torch.dtype | str | None = None) -> GpuSpec | None:
    """The table entry for a device name as ``torch.cuda.get_device_name()`` reports it (:func:`gpu_key`), e.g.
    "NVIDIA H100 80GB HBM3" → H100 SXM, "NVIDIA H100 NVL" → H100 NVL, "NVIDIA A100-PCIE-40GB" → A100; None when
    unknown (a CPU, another GPU: :data:`UNKNOWN_GPU`).

    With ``dtype`` (the precision the step computes in: ``torch.float32``, ``torch.bfloat16``, ``"tf32"``...)
    the entry's :attr:`~GpuSpec.peak_flops` is that precision's peak: an fp32 step on an H100 is measured
    against 67 TFLOP/s, not the 989 of bf16."""
    key = gpu_key(name)
    if key is None:
        return None
    spec = GPU_PEAKS[key]
    if dtype is None:
        return spec
    precision = precision_name(dtype)
    spec.peak(precision)  # a precision this GPU has no peak for is an error here, not later
    return replace(spec, dtype=precision)


def mfu(tokens_per_s: float, flops_per_token: float, peak_flops: float | GpuSpec,
        dtype: torch.dtype | str | None = None) -> float:
    """Model FLOPs utilisation: ``tokens_per_s · flops_per_token / peak_flops`` (a fraction, 0.4 = 40 %).

    ``peak_flops`` in FLOP/s for the whole set of GPUs the tokens were processed on, or a GpuSpec (one
    GPU): then the peak of ``dtype``, the precision the step computes in (default: the spec's own
    :attr:`~GpuSpec.dtype`, 16-bit for the table's entries). An fp32 step divided by the bf16 peak would
    report an MFU 15x too low on an H100. For ``g`` GPUs use ``g · spec.peak(dtype)`` with the total
    throughput, or the per-GPU throughput."""
    if isinstance(peak_flops, GpuSpec):
        peak = peak_flops.peak(dtype) if dtype is not None else peak_flops.peak_flops
    else:
        if dtype is not None:
            raise ValueError("dtype picks a peak from a GpuSpec; peak_flops is already a number of FLOP/s")
        peak = float(peak_flops)
    if not peak > 0:
        raise ValueError(f"peak_flops must be positive, got {peak_flops!r}")
    if tokens_per_s < 0 or flops_per_token < 0:
        raise ValueError("tokens_per_s and flops_per_token must be non-negative")
    return tokens_per_s * flops_per_token / peak


def hfu(tokens_per_s: float, hardware_flops_per_token: float, peak_flops: float | GpuSpec,
        dtype: torch.dtype | str | None = None) -> float:
    """Hardware FLOPs utilisation: :func:`mfu`'s ratio with the FLOPs the hardware ran
    (:func:`hardware_flops_per_token`, recomputation included) instead of the model's. Equal to the MFU
    without activation checkpointing, larger with it (at most 8/6 of it with full checkpointing)."""
    return mfu(tokens_per_s, hardware_flops_per_token, peak_flops, dtype)


__all__ = ["TERA", "flops_per_token", "layer_forward_flops_per_token", "hardware_flops_per_token", "hfu",
           "precision_name", "GpuSpec", "GPU_PEAKS", "UNKNOWN_GPU", "gpu_key", "gpu_peak", "mfu"]
