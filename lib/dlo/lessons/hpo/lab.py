"""The plumbing of ``Jour4/hpo.ipynb``'s core path: run one Optuna study on the CIFAR task with a progress bar and
its summary row (:func:`run_study`), and draw each trial's validation curve, pruned or not (:func:`plot_trials`).
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Mapping

from dlo.lessons.hpo.journal import study_summary
from dlo.measure import bench
from dlo.measure.records import torch_threads


def run_study(name: str, objective: Callable[[Any], float], n_trials: int, *, pruner: Any = None, seed: int = 0,
              threads: int | None = None, bar: Any = None) -> tuple[Any, dict[str, Any]]:
    """A maximising Optuna study named ``name`` (TPE seeded with ``seed``; ``pruner``, default none) optimised for
    ``n_trials`` trials under a progress bar (``bar``, a tqdm bar, or a new one), inside ``torch_threads(threads)``: ``(study, summary row)``."""
    import optuna
    from tqdm.auto import tqdm

    study = optuna.create_study(direction="maximize", study_name=name, pruner=pruner or optuna.pruners.NopPruner(),
                                sampler=optuna.samplers.TPESampler(seed=seed))
    bar = bar if bar is not None else tqdm(desc=f"{name}: trials")
    bar.reset(total=n_trials)
    with torch_threads(threads):
        t0 = time.perf_counter()
        study.optimize(objective, n_trials=n_trials, callbacks=[lambda st, tr: bar.update()])
        wall = time.perf_counter() - t0
    bar.close()
    return study, study_summary(study, wall, name)


def plot_trials(studies: Mapping[str, Any], epochs: int, path: str | Path | None = None):
    """One panel per study, one line per trial (validation accuracy per epoch): blue ran to the end, red pruned."""
    import matplotlib.pyplot as plt
    import optuna

    fig, axes = plt.subplots(1, len(studies), figsize=(3.6 * len(studies), 3.3), sharey=True, squeeze=False)
    for ax, (name, study) in zip(axes[0], studies.items()):
        for t in study.trials:
            steps = sorted(t.intermediate_values)
            pruned = t.state == optuna.trial.TrialState.PRUNED
            ax.plot(steps, [t.intermediate_values[s] for s in steps], marker="x" if pruned else "o",
                    color="tab:red" if pruned else "tab:blue", alpha=0.8)
        ax.set(title=name, xlabel="epoch", xticks=range(1, epochs + 1))
    axes[0][0].set_ylabel("validation accuracy")
    fig.suptitle("Each line is a trial: blue = ran to the end, red = pruned", fontsize=10)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


__all__ = ["run_study", "plot_trials"]
