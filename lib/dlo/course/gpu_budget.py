"""The time plan of ``dlo gpu-check --quick`` (no torch here: ``dlo gpu-check --help`` shows it).

GPU minutes come in short pieces, so ``--quick`` spends them on the targets first: the one-GPU target benchmarks,
each under its own cap (:data:`QUICK_CAPS_S`, in :data:`QUICK_ORDER`), then the notebooks' dry profiles in what is
left of the budget. A step never runs beyond the budget left, and is not started when the budget left is below
what it needs to say anything (:data:`QUICK_NEEDS_S`): its row then says so ("not run: N s left, it needs M s").

On a CPU (``--dry-run``) the same plan runs with caps sized for a small CPU (:data:`DRY_CAPS_S`, measured on a
loaded 2-core machine), so that every row runs or says why not within about 5 minutes.
"""
from __future__ import annotations

#: The whole of ``--quick`` on a GPU: benchmarks and notebooks (under 8 minutes with the start and the table).
QUICK_BUDGET_S = 450.0
#: The order of ``--quick``: the one-GPU target benchmarks first, the multi-GPU ones after (skipped on one GPU).
QUICK_ORDER = ("fsdp_mfu", "jour1_ladder", "mixcutmix", "pipeline_1f1b", "tp_vs_dtensor", "grid_3d")
#: Left out of ``--quick``: it trains to 94 % on the real CIFAR-10 (``gpu-check --only race``).
NOT_QUICK = {"race": "not in --quick: it trains to 94 % on the real CIFAR-10 (run gpu-check --only race)"}
#: The cap of each benchmark in ``--quick`` on a GPU (seconds).
QUICK_CAPS_S = {"fsdp_mfu": 180.0, "jour1_ladder": 150.0, "mixcutmix": 45.0, "pipeline_1f1b": 90.0,
                "tp_vs_dtensor": 90.0, "grid_3d": 90.0}
#: The least time a benchmark needs to say anything on a GPU (start-up, compilation, its first timed steps).
QUICK_NEEDS_S = {"fsdp_mfu": 100.0, "jour1_ladder": 90.0, "mixcutmix": 20.0, "pipeline_1f1b": 45.0,
                 "tp_vs_dtensor": 45.0, "grid_3d": 45.0}
#: One notebook's dry profile on a GPU: its cap, and the least time worth starting it with.
NOTEBOOK_CAP_S, NOTEBOOK_NEED_S = 120.0, 20.0

#: ``--dry-run`` (a CPU): the whole, the caps and the needs, sized on a loaded 2-core machine, where the benchmarks
#: at smoke size took: mixcutmix 4 s, fsdp_mfu 70 s, pipeline_1f1b 24 s, tp_vs_dtensor 29 s, grid_3d 26 s, race 23 s
#: (2 gloo processes each); Jour 1's smoke profile took over 10 minutes, so it is not started inside this budget, and
#: its row says so.
DRY_BUDGET_S = 270.0
DRY_CAPS_S = {"fsdp_mfu": 120.0, "jour1_ladder": 900.0, "mixcutmix": 60.0, "pipeline_1f1b": 60.0,
              "tp_vs_dtensor": 60.0, "grid_3d": 60.0, "race": 90.0}
DRY_NEEDS_S = {"fsdp_mfu": 45.0, "jour1_ladder": 600.0, "mixcutmix": 10.0, "pipeline_1f1b": 20.0,
               "tp_vs_dtensor": 20.0, "grid_3d": 20.0, "race": 30.0}
DRY_NOTEBOOK_CAP_S, DRY_NOTEBOOK_NEED_S = 120.0, 30.0


def one_gpu_caps_s() -> float:
    """The sum of the one-GPU benchmarks' caps in ``--quick``: what is left of the budget goes to the notebooks."""
    return sum(QUICK_CAPS_S[name] for name in QUICK_ORDER[:3])


def quick_plan_text() -> str:
    """The plan in one sentence, for ``--help``."""
    caps = ", then ".join(f"{name} {QUICK_CAPS_S[name]:.0f} s" for name in QUICK_ORDER[:3])
    return (f"{caps} (caps summing to {one_gpu_caps_s():.0f} s), then the notebooks' dry profiles in what is left "
            f"of the {QUICK_BUDGET_S:.0f} s budget")


def caps(dry: bool) -> tuple[dict[str, float], dict[str, float], float, float, float]:
    """(benchmark caps, benchmark needs, notebook cap, notebook need, default budget) for a GPU or a dry run."""
    if dry:
        return DRY_CAPS_S, DRY_NEEDS_S, DRY_NOTEBOOK_CAP_S, DRY_NOTEBOOK_NEED_S, DRY_BUDGET_S
    return QUICK_CAPS_S, QUICK_NEEDS_S, NOTEBOOK_CAP_S, NOTEBOOK_NEED_S, QUICK_BUDGET_S


def not_run(left_s: float, need_s: float) -> str:
    """The row of a step not started: the budget left is below what it needs."""
    return f"not run: {max(0.0, left_s):.0f} s left, it needs {need_s:.0f} s"


def timed_out(cap_s: float) -> str:
    """The row of a step stopped by its cap or by the budget (not a failure)."""
    return f"timed out after {cap_s:.0f} s"
