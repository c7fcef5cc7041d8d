"""The roofline model: is a kernel limited by arithmetic or by memory traffic?

A kernel that does ``F`` floating-point operations and moves ``B`` bytes between memory and the chip has
an **arithmetic intensity** ``I = F / B`` (FLOP per byte). On a device with a peak arithmetic rate ``P``
(FLOP/s) and a memory bandwidth ``W`` (byte/s) it cannot run faster than either limit::

    attainable(I) = min(P, I x W)

Plotted on log-log axes this is a slanted "roof" (memory-bound, ``I x W``) meeting a flat one
(compute-bound, ``P``) at the **knee** ``I* = P / W``. Below the knee, more FLOPs per byte means more
FLOP/s; above it, only a faster ALU helps. Modern GPUs have high knees (an H100 needs ~300 bf16 FLOP per
byte of HBM traffic), so everything that is not a large matmul or convolution (normalisation,
activations, pooling, additions, optimizer updates) is memory-bound there.

A matmul ``C[M, N] = A[M, K] @ B[K, N]`` does ``2MNK`` FLOPs (one multiply and one add per term) and, at
best, reads A and B once and writes C once: ``(MK + KN + MN) x bytes per element``. For M = N = K = n its
intensity is ``2n^3 / (3n^2 x b) = 2n / (3b)``: it grows with the size, which is why small matmuls are
memory-bound and large ones compute-bound. (Real kernels move more than this minimum when the operands do
not fit in the caches; the formula is the ideal the kernels approach.)

Reference peaks and bandwidths come from :data:`dlo.measure.flops.GPU_PEAKS` (vendor datasheets, see
REFERENCES.md (repository root)): one table for the whole workbook. The measured side: :func:`measure_matmul`
(a sweep of matmul sizes timed with :mod:`dlo.measure.bench`) and :func:`measure_bandwidth` (a large copy).
:func:`classify_ops` splits a ``torch.profiler`` profile into compute-bound and memory-bound operators.
"""
from __future__ import annotations

import math
import numbers
import re
import statistics
from typing import Any, Iterable, Sequence

import torch

from dlo.measure.bench import quartiles, time_calls
from dlo.measure.flops import GPU_PEAKS, TERA, GpuSpec, gpu_peak

GIGA = 10**9

#: Bytes per element of the dtypes the course measures.
DTYPE_BYTES: dict[torch.dtype, int] = {torch.float64: 8, torch.float32: 4, torch.bfloat16: 2, torch.float16: 2,
                                        torch.int8: 1}

#: Which peak of a :class:`~dlo.measure.flops.GpuSpec` applies to a matmul in a dtype ("tf32": fp32 inputs with
#: TF32 Tensor Cores allowed, ``torch.backends.cuda.matmul.allow_tf32 = True``).
_PEAK_FIELD = {"bf16": "bf16_tflops", "fp16": "bf16_tflops", "tf32": "tf32_tflops", "fp32": "fp32_tflops"}


def dtype_bytes(dtype: torch.dtype | int) -> int:
    """Bytes per element of ``dtype`` (an int is taken as the byte count itself)."""
    if isinstance(dtype, bool):
        raise TypeError(f"dtype must be a torch.dtype or a byte count, got {dtype!r}")
    if isinstance(dtype, int):
        if dtype < 1:
            raise ValueError(f"bytes per element must be a positive integer, got {dtype}")
        return dtype
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype}: use one of {', '.join(str(d) for d in DTYPE_BYTES)} "
                         "or give the bytes per element as an int")
    return DTYPE_BYTES[dtype]


def _positive_ints(**dims: Any) -> None:
    for name, v in dims.items():
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ValueError(f"{name} must be a positive integer, got {v!r}")


def matmul_flops(m: int, n: int, k: int) -> int:
    """FLOPs of ``[m, k] @ [k, n]``: ``2mnk`` (a multiply and an add per term of each dot product)."""
    _positive_ints(m=m, n=n, k=k)
    return 2 * m * n * k


def matmul_bytes(m: int, n: int, k: int, dtype: torch.dtype | int = torch.float32) -> int:
    """Minimum bytes moved by ``[m, k] @ [k, n]``: read A and B once, write C once."""
    _positive_ints(m=m, n=n, k=k)
    return (m * k + k * n + m * n) * dtype_bytes(dtype)


def arithmetic_intensity(m: int, n: int, k: int, dtype: torch.dtype | int = torch.float32) -> float:
    """FLOP per byte of a matmul: ``2mnk / ((mk + kn + mn) x bytes per element)``."""
    return matmul_flops(m, n, k) / matmul_bytes(m, n, k, dtype)


def attainable(intensity: float | Sequence[float], peak_flops: float, bandwidth: float):
    """The roofline: ``min(peak_flops, intensity x bandwidth)`` in FLOP/s (bandwidth in byte/s).
    Works on a number or a sequence / array of intensities."""
    if not peak_flops > 0 or not bandwidth > 0:
        raise ValueError(f"peak_flops and bandwidth must be positive, got {peak_flops!r} and {bandwidth!r}")
    if isinstance(intensity, (int, float)):
        if intensity < 0:
            raise ValueError(f"intensity must be >= 0, got {intensity}")
        return min(float(peak_flops), float(intensity) * bandwidth)
    return [attainable(float(i), peak_flops, bandwidth) for i in intensity]


def knee(peak_flops: float, bandwidth: float) -> float:
    """The intensity (FLOP/byte) where the memory roof meets the compute roof: ``peak / bandwidth``."""
    if not peak_flops > 0 or not bandwidth > 0:
        raise ValueError(f"peak_flops and bandwidth must be positive, got {peak_flops!r} and {bandwidth!r}")
    return peak_flops / bandwidth


def spec_roofline(spec: GpuSpec | str, precision: str = "bf16") -> tuple[float, float]:
    """``(peak FLOP/s, bandwidth byte/s)`` of a reference GPU (a :class:`GpuSpec`, a key of
    :data:`GPU_PEAKS` such as "H100", or a device name) for ``precision`` 'bf16' | 'fp16' | 'tf32' | 'fp32'."""
    if isinstance(spec, str):
        key = spec
        spec = GPU_PEAKS.get(spec) or gpu_peak(spec)
        if spec is None:
            raise ValueError(f"no reference figures for {key!r}: use one of {', '.join(GPU_PEAKS)}")
    if precision not in _PEAK_FIELD:
        raise ValueError(f"precision must be one of {', '.join(_PEAK_FIELD)}, got {precision!r}")
    tflops = getattr(spec, _PEAK_FIELD[precision])
    if tflops is None:
        raise ValueError(f"{spec.name} has no {precision} peak in the reference table ({spec.note or 'not listed'})")
    return tflops * TERA, spec.hbm_tb_s * TERA


def reference_table():
    """The cited peaks, HBM bandwidths and knees of V100 / A100 / H100 / H200 as a DataFrame (reference
    figures from vendor datasheets via :data:`dlo.measure.flops.GPU_PEAKS`, dense, no sparsity: not measured here)."""
    import pandas as pd

    rows = []
    for key, spec in GPU_PEAKS.items():
        row: dict[str, Any] = {"gpu": spec.name, "bf16/fp16 TFLOP/s": spec.bf16_tflops, "tf32 TFLOP/s": spec.tf32_tflops,
                               "fp32 TFLOP/s": spec.fp32_tflops, "HBM TB/s": spec.hbm_tb_s}
        row["knee bf16 (FLOP/B)"] = round(knee(*spec_roofline(spec, "bf16")), 1)
        row["knee fp32 (FLOP/B)"] = round(knee(*spec_roofline(spec, "fp32")), 1)
        row["square matmul n at bf16 knee"] = knee_matmul_size(*spec_roofline(spec, "bf16"), torch.bfloat16)
        rows.append(row)
    return pd.DataFrame(rows)


def knee_matmul_size(peak_flops: float, bandwidth: float, dtype: torch.dtype | int = torch.float32) -> int:
    """The smallest square matmul size n (M = N = K = n) whose ideal intensity ``2n / (3b)`` reaches the knee."""
    return math.ceil(1.5 * dtype_bytes(dtype) * knee(peak_flops, bandwidth))


# --------------------------------------------------------------------------------------------------
# Measurements
# --------------------------------------------------------------------------------------------------

def _device(device: torch.device | str | None) -> torch.device:
    return torch.device(device) if device is not None else torch.device("cpu")


def measure_matmul(sizes: Iterable[int | tuple[int, int, int]], *, dtype: torch.dtype = torch.float32,
                   device: torch.device | str | None = None, warmup: int = 2, repeats: int = 5,
                   min_seconds: float = 0.0, progress: str | None = None) -> list[dict[str, Any]]:
    """Time ``A @ B`` for each size (``n`` for M = N = K = n, or an ``(m, n, k)`` triple) with
    :func:`dlo.measure.bench.time_calls` (synchronised, warm-up excluded, median of ``repeats``).

    One record per size: m, n, k, dtype, flops, bytes (the ideal minimum), intensity, median_s, tflops
    (measured FLOP/s / 1e12), its noise band ``tflops_low``-``tflops_high`` (from the quartiles of the timed
    calls) and ``spread`` (interquartile range / median). ``min_seconds``: small matmuls are repeated inside
    one timed call until a call lasts about that long, so that timer resolution and launch overhead do not dominate.
    """
    dev = _device(device)
    sizes = list(sizes)
    if not sizes:
        raise ValueError("measure_matmul needs at least one size")
    iterator: Iterable = sizes
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(sizes, desc=progress, leave=False)
    records = []
    g = torch.Generator(device="cpu").manual_seed(0)
    for size in iterator:
        m, n, k = (size, size, size) if isinstance(size, int) else tuple(size)
        _positive_ints(m=m, n=n, k=k)
        a = torch.randn(m, k, generator=g).to(dev, dtype)
        b = torch.randn(k, n, generator=g).to(dev, dtype)
        out = torch.empty(m, n, device=dev, dtype=dtype)
        inner = 1
        if min_seconds > 0:
            one = min(time_calls(lambda: torch.matmul(a, b, out=out), warmup=1, repeats=1, device=dev))
            inner = max(1, min(1000, int(min_seconds / max(one, 1e-9))))

        def call() -> None:
            for _ in range(inner):
                torch.matmul(a, b, out=out)

        times = time_calls(call, warmup=warmup, repeats=repeats, device=dev)
        median = statistics.median(times) / inner
        q25, q75 = (t / inner for t in quartiles(times))
        flops = matmul_flops(m, n, k)
        records.append({"m": m, "n": n, "k": k, "dtype": str(dtype).replace("torch.", ""), "device": str(dev),
                        "flops": flops, "bytes": matmul_bytes(m, n, k, dtype),
                        "intensity": arithmetic_intensity(m, n, k, dtype), "median_s": median,
                        "tflops": flops / median / TERA, "inner_calls": inner,
                        "tflops_low": flops / q75 / TERA, "tflops_high": flops / q25 / TERA,
                        "spread": (q75 - q25) / median})
        del a, b, out
    return records


def measure_bandwidth(*, nbytes: int = 256 * 2**20, device: torch.device | str | None = None, warmup: int = 2,
                      repeats: int = 5) -> dict[str, Any]:
    """Memory bandwidth from a large copy ``dst.copy_(src)``: it reads ``nbytes`` and writes ``nbytes``, so
    ``bandwidth = 2 x nbytes / time`` (byte/s). Make ``nbytes`` much larger than the last-level cache (tens
    of MiB on CPUs, 50 MiB L2 on an H100), else you measure the cache, not the memory."""
    if isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 4096:
        raise ValueError(f"nbytes must be an integer of at least 4096 (use >> the cache size), got {nbytes!r}")
    dev = _device(device)
    n = nbytes // 4
    src = torch.ones(n, device=dev, dtype=torch.float32)
    dst = torch.empty_like(src)
    times = time_calls(lambda: dst.copy_(src), warmup=warmup, repeats=repeats, device=dev)
    median = statistics.median(times)
    q25, q75 = quartiles(times)
    moved = 2 * n * 4
    del src, dst
    return {"device": str(dev), "bytes_moved": moved, "median_s": median, "bandwidth": moved / median,
            "gb_s": moved / median / GIGA, "gb_s_low": moved / q75 / GIGA, "gb_s_high": moved / q25 / GIGA,
            "spread": (q75 - q25) / median}


def measured_roofline(matmul_records: Sequence[dict[str, Any]], bandwidth_record: dict[str, Any]) -> dict[str, float]:
    """This machine's roofline from measurements: the best matmul FLOP/s of a sweep as the (achievable)
    peak, the copy bandwidth as the memory roof, and their knee."""
    if not matmul_records:
        raise ValueError("measured_roofline needs at least one matmul record")
    peak = max(r["tflops"] for r in matmul_records) * TERA
    bw = float(bandwidth_record["bandwidth"])
    return {"peak_flops": peak, "bandwidth": bw, "knee": knee(peak, bw)}


def device_reference(device: torch.device | str | None = None, precision: str = "bf16") -> dict[str, Any] | None:
    """The cited roofline of the GPU in use (``{"name", "peak_flops", "bandwidth", "knee"}``), or None on a
    CPU or an unlisted GPU (its peak is not in the reference table)."""
    dev = _device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    spec = gpu_peak(torch.cuda.get_device_name(dev))
    if spec is None:
        return None
    try:
        peak, bw = spec_roofline(spec, precision)
    except ValueError:
        return None
    return {"name": spec.name, "precision": precision, "peak_flops": peak, "bandwidth": bw, "knee": knee(peak, bw)}


# --------------------------------------------------------------------------------------------------
# Compute-bound vs memory-bound operators in a profile
# --------------------------------------------------------------------------------------------------

#: The stated rule. Convolutions and matrix products reuse each loaded value many times (a 3x3 conv with C
#: input channels: ~9C/2 FLOP per byte of activations in fp32, hundreds for C >= 64), so they are
#: compute-bound on a real network. Everything else that touches data (normalisation, activations, pooling,
#: additions, losses, optimizer updates, copies) does a few FLOPs per element loaded: ~1 FLOP/byte or
#: less, far below any knee, so memory-bound. Views, allocations and autograd's own bookkeeping (the
#: ``...Backward0`` nodes, whose work is in the aten operators they call) are "overhead": no work on the data.
COMPUTE_BOUND = re.compile(r"conv|(?<![a-z])mm(?![a-z])|addmm|bmm|baddbmm|matmul|linear|gemm|sdpa|"
                           r"scaled_dot_product|flash_attention|efficient_attention", re.IGNORECASE)
OVERHEAD = re.compile(r"^(empty|empty_like|empty_strided|view|_unsafe_view|reshape|as_strided_?|t|flatten|"
                      r"transpose|permute|expand|resize_|detach_?|select|slice|unsqueeze|squeeze|alias|"
                      r"lift_fresh|_reshape_alias|set_|size|stride|is_contiguous|numpy_T|result_type|item|"
                      r"_local_scalar_dense|contiguous|resolve_conj|resolve_neg|AccumulateGrad|"
                      r"\w+Backward\d*)$")
SKIPPED = re.compile(r"^(ProfilerStep|autograd::engine::evaluate_function|enumerate\(DataLoader\)|"
                     r"Optimizer\.zero_grad|cuda(Launch|Stream|DeviceSynchronize|EventRecord|Memcpy)|"
                     r"Memcpy|Memset|## )", re.IGNORECASE)


def op_kind(name: str) -> str:
    """'compute-bound', 'memory-bound' or 'overhead' for a profiler operator name (see the rule above
    :data:`COMPUTE_BOUND`); e.g. ``aten::convolution_backward`` -> compute-bound,
    ``aten::native_batch_norm`` -> memory-bound, ``aten::view`` or ``ConvolutionBackward0`` -> overhead."""
    base = name.split("::")[-1]
    if "#" in name or OVERHEAD.search(base):  # "Optimizer.step#SGD.step": a record_function label around other ops
        return "overhead"
    if COMPUTE_BOUND.search(base):
        return "compute-bound"
    return "memory-bound"


def _self_time_us(evt: Any, device_type: str) -> float:
    if device_type == "cuda":
        for attr in ("self_device_time_total", "self_cuda_time_total"):
            if hasattr(evt, attr):
                return float(getattr(evt, attr))
        return 0.0
    return float(evt.self_cpu_time_total)


def classify_ops(prof: Any, *, device_type: str = "cpu", top: int | None = None):
    """A profile's operators with their kind and self time, as a DataFrame sorted by time.

    ``prof``: a finished ``torch.profiler.profile`` (or its ``key_averages()``). ``device_type``: 'cpu'
    ranks by CPU self time, 'cuda' by GPU (device) self time, the time the kernels ran. Self time (the
    operator's own time, without its children) avoids counting ``aten::conv2d`` and the
    ``aten::mkldnn_convolution`` it calls twice. Columns: op, kind (:func:`op_kind`), calls, self_ms,
    share (of the total self time of the listed operators), flops (when the profiler counted them:
    ``with_flops=True``; it counts matmuls and convolutions only, on the top-level operator such as
    ``aten::conv2d``, whose *self* time is small: its children do the work).
    """
    import pandas as pd

    if device_type not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
    events = prof.key_averages() if hasattr(prof, "key_averages") else prof
    rows = []
    for evt in events:
        name = evt.key
        if SKIPPED.search(name):
            continue
        if device_type == "cuda" and str(getattr(evt, "device_type", "")).upper().endswith(("CUDA", "PRIVATEUSE1")):
            continue  # the kernels themselves: their time is already in the self device time of the op that launched them
        t = _self_time_us(evt, device_type)
        if t <= 0:
            continue
        flops = float(getattr(evt, "flops", 0) or 0)
        rows.append({"op": name, "kind": op_kind(name), "calls": int(evt.count), "self_ms": t / 1000.0,
                     "flops": flops or None})
    if not rows:
        raise ValueError("the profile holds no timed operators: profile at least one step (and on a GPU pass "
                         "activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA] and device_type='cuda')")
    df = pd.DataFrame(rows).sort_values("self_ms", ascending=False, ignore_index=True)
    df["share"] = df["self_ms"] / df["self_ms"].sum()
    df = df[["op", "kind", "calls", "self_ms", "share", "flops"]]
    return df.head(top) if top else df


def time_by_kind(ops) -> dict[str, float]:
    """Share of the profiled time per kind (from :func:`classify_ops`' table), summing to 1."""
    shares = ops.groupby("kind")["self_ms"].sum()
    total = float(shares.sum())
    return {kind: float(v) / total for kind, v in shares.items()}


# --------------------------------------------------------------------------------------------------
# Shapes
# --------------------------------------------------------------------------------------------------

def pad_to_multiple(n: int, k: int) -> int:
    """The smallest multiple of ``k`` that is >= ``n`` (e.g. a vocabulary of 50257 -> 50304 for k = 64)."""
    _positive_ints(n=n, k=k)
    return -(-n // k) * k


def pad_channels(x: torch.Tensor, multiple: int = 4) -> torch.Tensor:
    """Zero-pad dim 1 (channels) of an NCHW batch up to a multiple (3 -> 4): a convolution whose weight
    gets matching zero input channels gives the same result, and NHWC kernels get aligned pixels."""
    if x.ndim != 4:
        raise ValueError(f"expected an NCHW batch (4 dims), got shape {tuple(x.shape)}")
    extra = pad_to_multiple(x.shape[1], multiple) - x.shape[1]
    if extra == 0:
        return x
    padded = torch.nn.functional.pad(x, (0, 0, 0, 0, 0, extra))
    if x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous():
        padded = padded.contiguous(memory_format=torch.channels_last)  # keep the caller's layout
    return padded


def waves(m: int, n: int, sms: int, tile: tuple[int, int] = (128, 128)) -> float:
    """How many "waves" of output tiles a GPU matmul of an ``m x n`` output needs: ``ceil(m/tm) x ceil(n/tn)``
    tiles spread over ``sms`` streaming multiprocessors, one tile each at a time. A fractional part means
    a last, partly idle wave (wave quantization): 1.01 waves cost about as much as 2."""
    _positive_ints(m=m, n=n, sms=sms)
    tiles = math.ceil(m / tile[0]) * math.ceil(n / tile[1])
    return tiles / sms


__all__ = ["DTYPE_BYTES", "dtype_bytes", "matmul_flops", "matmul_bytes", "arithmetic_intensity", "attainable",
           "knee", "spec_roofline", "reference_table", "knee_matmul_size", "measure_matmul", "measure_bandwidth",
           "measured_roofline", "device_reference", "op_kind", "classify_ops", "time_by_kind", "pad_to_multiple",
           "pad_channels", "waves", "COMPUTE_BOUND", "OVERHEAD"]
