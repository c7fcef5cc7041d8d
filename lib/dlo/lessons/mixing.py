"""``dlo mix-bench``: MixUp/CutMix, the per-sample loop against the batched kernel, timed.
"""
from __future__ import annotations

import sys
from typing import Any, Sequence

import torch
from dlo.data.augment import KINDS, cutmix, cutmix_reference, mixup, mixup_reference, sample_mix_params
from dlo.measure.records import torch_threads
from dlo.measure.bench import Warmup, measure_interleaved
from dlo.measure.records import environment_info, save_json
from dlo.runtime.arguments import ScriptParser, at_least, device_name
from dlo.runtime.device import pick_device


# --------------------------------------------------------------------------------------------------
# Benchmark: loop vs batched
# --------------------------------------------------------------------------------------------------

def benchmark(batch_size: int = 256, image_size: int = 32, device: torch.device | str | None = None,
              repeats: int | None = None, kinds: Sequence[str] = KINDS, *, warmup: int | None = None,
              dtype: torch.dtype = torch.float32, channels: int = 3, seed: int = 0,
              threads: int | None = None, progress: bool = False) -> list[dict[str, Any]]:
    """Images per second of the loop and batched versions, with the same params (sampling excluded).

    Timed with :func:`dlo.measure.bench.measure_interleaved` (synchronised, warmed up until steady, or ``warmup``
    calls when given: a batched kernel's first calls can be 100x slower than its steady ones; the two
    versions alternated, median of ``repeats``; default 20 on CPU, 50 on GPU). One record per (kind,
    implementation); the batched records carry the ``speedup`` over the loop (the loop's is 1.0), from the
    medians; ``measurement`` is the full record (every timed call), for a sentence that says whether the
    difference is beyond the noise (``dlo.measure.conclude``). ``best_images_per_s`` (the fastest
    call) is kept too: on a machine shared with other work it shows what the code does when left alone.

    ``threads`` sets torch's CPU threads for the measurement (None: leave as is). On a CPU whose cores
    are busy with other work, one thread can be faster for these small memory-bound operations: a
    multi-threaded operation waits for its slowest thread, and a thread waiting for a busy core waits
    for the scheduler (milliseconds).

    ``progress`` shows one bar per (kind, device) while it is timed (calls counted, warm-up included): a text
    line at least every 15 s under ``dlo run``, a tqdm bar in Jupyter.
    """

    with torch_threads(threads):
        return _benchmark(batch_size, image_size, pick_device(device if device is not None else "auto"), repeats,
                          kinds, warmup=warmup, dtype=dtype, channels=channels, seed=seed, progress=progress)


def _benchmark(batch_size: int, image_size: int, dev: torch.device, repeats: int | None, kinds: Sequence[str], *,
               warmup: int | None, dtype: torch.dtype, channels: int, seed: int,
               progress: bool = False) -> list[dict[str, Any]]:

    if repeats is None:
        repeats = 50 if dev.type == "cuda" else 20
    for kind in kinds:
        if kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}: use {KINDS}")
    gen = torch.Generator().manual_seed(seed)
    images = torch.rand(batch_size, channels, image_size, image_size, generator=gen).to(device=dev, dtype=dtype)
    labels = torch.randint(10, (batch_size,), generator=gen).to(dev)
    records: list[dict[str, Any]] = []
    for kind in kinds:
        params = sample_mix_params(batch_size, 1.0, kind=kind, height=image_size, width=image_size,
                                   generator=gen, device=dev)
        loop, batched = (mixup_reference, mixup) if kind == "mixup" else (cutmix_reference, cutmix)
        # the two versions timed interleaved (loop, batched, loop, ...): a drift of the machine hits both alike
        ms = measure_interleaved({f"{kind} {impl} ({dev.type})": (lambda fn=fn: fn(images, labels, params,
                                                                                   num_classes=10))
                                  for impl, fn in (("loop", loop), ("batched", batched))},
                                 items_per_call=batch_size, warmup=Warmup() if warmup is None else warmup,
                                 repeats=repeats, device=dev,
                                 track_memory=False, progress=progress)
        base = None
        for impl, m in zip(("loop", "batched"), ms.values()):
            base = m.throughput if base is None else base
            records.append({"kind": kind, "implementation": impl, "device": str(dev), "dtype": str(dtype),
                            "batch_size": batch_size, "image_size": image_size, "threads": torch.get_num_threads(),
                            "images_per_s": m.throughput, "median_s": m.median_s,
                            "best_images_per_s": batch_size / min(m.times_s), "repeats": repeats, "warmup": m.warmup,
                            "speedup": m.throughput / base, "measurement": m.to_record()})
    return records


def format_table(records: Sequence[dict[str, Any]]) -> str:
    """A short plain-text table of :func:`benchmark` records (no pandas needed)."""
    lines = [f"{'kind':<8} {'impl':<8} {'images/s':>12} {'ms/call':>9} {'speed-up':>9} {'best img/s':>12}"]
    for r in records:
        lines.append(f"{r['kind']:<8} {r['implementation']:<8} {r['images_per_s']:>12,.0f} "
                     f"{r['median_s'] * 1000:>9.2f} {r['speedup']:>8.1f}x {r['best_images_per_s']:>12,.0f}")
    lines.append("(images/s and speed-up: median of the timed calls; best img/s: the fastest call)")
    return "\n".join(lines)


def _parser() -> ScriptParser:
    p = ScriptParser(prog="python -m dlo mix-bench",
                     description="Benchmark MixUp / CutMix: per-image Python loop vs batched.")
    p.add_argument("--device", type=device_name, default="auto", help="auto, cpu, cuda or cuda:N (default: auto)")
    p.add_argument("--batch-size", type=at_least(1), default=256)
    p.add_argument("--image-size", type=at_least(1), default=32)
    p.add_argument("--repeats", type=at_least(1), default=None, help="timed calls (default 20 on CPU, 50 on GPU)")
    p.add_argument("--warmup", type=at_least(0), default=None, help="untimed calls first (default: until steady)")
    p.add_argument("--dtype", choices=("float32", "bfloat16", "float16"), default="float32")
    p.add_argument("--threads", type=at_least(1), default=None, help="torch CPU threads (default: leave as is)")
    p.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS))
    p.add_argument("--out", default=None, help="write the records and environment as JSON here")
    return p


def main(argv: list[str] | None = None) -> int:
    """``dlo mix-bench``: 0 when done, 2 (after one line on stderr) for a bad option or a device that is not there."""
    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help (0), or a refused option: its one line is written
        return int(exc.code or 0)
    try:
        device = pick_device(args.device)
        records = benchmark(args.batch_size, args.image_size, device, args.repeats, tuple(args.kinds),
                            warmup=args.warmup, dtype=getattr(torch, args.dtype), threads=args.threads)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    env = environment_info(device)
    print(f"MixUp / CutMix on {env.get('gpu') or env['cpu']} ({device}), batch {args.batch_size}, "
          f"{args.image_size}x{args.image_size}, {args.dtype}, {records[0]['threads']} CPU thread(s)")
    print(format_table(records))
    if args.out:
        path = save_json({"environment": env, "config": vars(args), "records": records}, args.out)
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
