"""The sentences of the notebooks that state an outcome say what their run measured or counted.

Each claim that a run once contradicted is pinned here, on fabricated numbers (the function that writes the
sentence), on the notebook's text where the claim is a formula, and on the notebook's results.json when a run
left one under runs/ or $DLO_RUNS_DIR (as tests/test_conclusions.py reads them):

- recipes: "the runs with a growing batch take fewer steps" (40 against 24 the other way): the sentence now comes
  from the counted steps; the time column of single runs carries no verdict;
- optimizers: the "+ warm-up" runs start below their peak in every profile (a 1-step warm-up starts at the peak);
  the text's LARS trust ratio is the code's; "0.1 is inside the finder's range" and "what accumulation buys is
  memory" are written from this run's numbers (the measured peak only beyond its noise);
- DataLoader: the setting kept comes from interleaved repeats and the decision rule, and a loop that hardly
  waited for data gets "no difference beyond the noise";
- zero_grad: the call itself is timed, on gradients restored before each call, not two whole steps;
- attention: unsteady timings are flagged and carry no ratio;
- hpo: "PBT made N exploit/explore step(s)" was 0 in the dry rehearsal (trials one after another, asynchronous
  PBT): PBT is now synchronous, and a results.json whose population could exploit did.
"""
from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path

import pytest
import torch

import dlo  # noqa: F401  (before torchvision: prepares its import)
from dlo.lessons import claims
from dlo.lessons.loader.compare import epoch_starts_interleaved, keep_sentence
from dlo.lessons.lr_find import LRFinderResult
from dlo.lessons.zero_grad import share_sentence, time_zero_grad
from dlo.measure.bench import Measurement
from dlo.runtime import paths
from dlo.training import optim

ROOT = paths.ROOT


def _markdown(notebook: str) -> str:
    nb = json.loads((ROOT / notebook).read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "markdown")


def _code(notebook: str) -> str:
    nb = json.loads((ROOT / notebook).read_text())
    return "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")


def _results(name: str) -> list[Path]:
    roots = {ROOT / "runs", Path(os.environ.get("DLO_RUNS_DIR", ROOT / "runs"))}
    found = set()
    for root in roots:
        if root.is_dir():
            found.update(p for p in root.glob("**/results.json") if p.parent.name == name)
    return sorted(found)


def _load(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:  # removed since the search (a run cleaning up)
        pytest.skip(f"{path} went away")


# --- optimizers: warm-up ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("total", [3, 4, 6, 10, 37, 1000])
def test_a_warm_up_starts_below_the_peak(total):
    warm = optim.warmup_steps(total)
    assert 2 <= warm < total
    lrs = optim.schedule_values("warmup_cosine", total, lr=0.4, warmup_steps=warm)
    assert lrs[0] < 0.4 and lrs[0] == pytest.approx(0.4 / warm)
    assert max(lrs) == pytest.approx(0.4)


def test_warmup_steps_refuses_what_would_not_warm_up():
    assert optim.warmup_steps(6) == 2  # smoke's large-batch runs: 3 epochs of 2 steps (it was 1: no warm-up)
    assert optim.warmup_steps(100, fraction=0.2) == 20
    with pytest.raises(ValueError, match="cannot warm up"):
        optim.warmup_steps(2)
    with pytest.raises(ValueError, match="minimum"):
        optim.warmup_steps(10, minimum=1)


def test_the_notebook_warms_up_with_warmup_steps():
    code = _code("Jour3/optimizers.ipynb")
    assert "optim.warmup_steps(" in code and "max(1, large_steps_per_epoch" not in code


@pytest.mark.parametrize("path", _results("optimizers") or [None], ids=str)
def test_every_warm_up_run_of_a_results_json_started_below_its_peak(path):
    if path is None:
        pytest.skip("no optimizers results.json under runs/ or $DLO_RUNS_DIR yet")
    runs = [r for r in _load(path).get("runs", []) if "first_lr" in r]
    if not runs:
        pytest.skip(f"{path}: written before first_lr was recorded")
    for r in runs:
        if r["warmup_steps"]:
            assert r["first_lr"] < r["lr"], r["run"]


# --- optimizers: LARS's formula -------------------------------------------------------------------------------

def _lars_formula_of_the_text():
    """The trust ratio as the notebook writes it, made a Python function of (w, g, wd, eta)."""
    text = _markdown("Jour3/optimizers.ipynb")
    found = re.search(r"\*trust ratio\*\s*`([^`]+)`", text)
    assert found, "the optimizers notebook no longer writes LARS's trust ratio after '*trust ratio*'"
    formula = found.group(1)
    expr = formula.replace("η", "eta").replace("·", "*")
    expr = re.sub(r"‖([^‖]+)‖", r"norm(\1)", expr)
    expr = re.sub(r"([\w)])\s+(?=[\w(])", r"\1 * ", expr)  # "eta norm(w)": a product written by juxtaposition
    return formula, lambda w, g, wd, eta: eval(expr, {"norm": torch.linalg.vector_norm},  # noqa: S307
                                               {"w": w, "g": g, "wd": wd, "eta": eta})


def test_the_text_s_lars_trust_ratio_is_the_code_s():
    formula, text_ratio = _lars_formula_of_the_text()
    gen = torch.Generator().manual_seed(0)
    for wd in (0.0, 5e-4, 0.1):
        w, g = torch.randn(7, 5, generator=gen), torch.randn(7, 5, generator=gen)
        code = optim.lars_trust_ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(g), wd, 0.001)
        assert float(text_ratio(w, g, wd, 0.001)) == pytest.approx(float(code), rel=1e-6), formula
        # and the optimiser's step uses it: one LARS step without momentum moves p by lr * trust * (g + wd w)
        p = torch.nn.Parameter(w.clone())
        p.grad = g.clone()
        optim.LARS([p], lr=2.0, momentum=0.0, weight_decay=wd, trust_coefficient=0.001, eps=0.0).step()
        want = w - 2.0 * float(text_ratio(w, g, wd, 0.001)) * (g + wd * w)
        assert torch.allclose(p.detach(), want, atol=1e-6), formula


def test_the_text_names_the_square_root_scaling_of_lars_rate():
    text, code = _markdown("Jour3/optimizers.ipynb"), _code("Jour3/optimizers.ipynb")
    assert "lr=2.0 * math.sqrt(k)" in code and "√k" in text


# --- optimizers: the finder's range and accumulation's memory -------------------------------------------------

def _found(low, high):
    return LRFinderResult(lrs=[1e-4, 1e-3], losses=[1.0, 0.9], smoothed=[1.0, 0.9], steepest_lr=low,
                          min_loss_lr=high * 10, divergence_lr=None, suggested_range=(low, high), start_lr=1e-7,
                          end_lr=10.0, num_steps=40)


def test_the_range_sentence_says_where_the_rate_is():
    outside = _found(0.00035, 0.0035).range_sentence(0.1)  # the run that contradicted "inside the finder's range"
    assert "above" in outside and "inside" not in outside and "29" in outside
    assert "inside" in _found(0.02, 0.3).range_sentence(0.1)
    assert "below" in _found(0.5, 3.0).range_sentence(0.1)


def test_the_notebook_no_longer_asserts_the_rate_is_in_range():
    text, code = _markdown("Jour3/optimizers.ipynb"), _code("Jour3/optimizers.ipynb")
    assert "inside the finder's range on the real data" not in text
    assert "range_sentence(0.1" in code


def _acc_rows(saved1, saved4, peaks1, peaks4):
    return [{"accum_steps": 1, "saved_MiB": saved1, "peak_MiB": peaks1, "memory_kind": "cpu_rss_peak"},
            {"accum_steps": 4, "saved_MiB": saved4, "peak_MiB": peaks4, "memory_kind": "cpu_rss_peak"}]


def test_accumulation_states_the_peak_only_beyond_its_noise():
    # the run that said "what accumulation buys is memory" at 757 vs 765 MiB: readings that overlap
    s = claims.accumulation_sentence(_acc_rows(40.0, 10.0, [765.0, 757.0], [757.0, 761.0]))
    assert "does not tell them apart" in s and "agrees" not in s
    assert "4x more" in s or "4 x" in s or "4x" in s  # the counted difference, stated
    s = claims.accumulation_sentence(_acc_rows(40.0, 10.0, [900.0, 905.0], [760.0, 765.0]))
    assert "agrees" in s and "does not tell" not in s
    s = claims.accumulation_sentence(_acc_rows(40.0, 10.0, [700.0, 701.0], [760.0, 765.0]))
    assert "other way" in s
    s = claims.accumulation_sentence(_acc_rows(10.0, 10.0, [700.0, 701.0], [700.0, 702.0]))
    assert "saved nothing" in s


def test_saved_bytes_counts_one_micro_batch():
    net = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3))
    x = torch.randn(32, 8)
    saved = {b: claims.saved_bytes(lambda b=b: net(x[:b].clone()).sum()) for b in (8, 16, 32)}
    # weights + activations: the activations grow with the micro-batch, the weights do not
    assert saved[32] - saved[16] == 2 * (saved[16] - saved[8]) > 0
    assert saved[8] > sum(p.numel() * 4 for p in net.parameters() if p.dim() == 2)


@pytest.mark.parametrize("path", _results("optimizers") or [None], ids=str)
def test_the_accumulation_sentence_of_a_results_json_is_its_numbers(path):
    if path is None:
        pytest.skip("no optimizers results.json under runs/ or $DLO_RUNS_DIR yet")
    results = _load(path)
    if "accumulation_sentence" not in results:
        pytest.skip(f"{path}: written before the sentence was generated")
    assert results["accumulation_sentence"] == claims.accumulation_sentence(results["accumulation"])


# --- recipes: steps and times ---------------------------------------------------------------------------------

def test_the_steps_sentence_follows_the_counts():
    s = claims.steps_sentence({"baseline": 24, "dynamic-batch": 40, "everything": 40, "ema": 24}, "baseline")
    assert "more steps than baseline (24): dynamic-batch (40), everything (40)" in s
    assert "fewer" not in s and "as many steps as baseline (24): ema" in s
    assert "fewer steps than baseline (1568): dynamic-batch (1392)" in claims.steps_sentence(
        {"baseline": 1568, "dynamic-batch": 1392}, "baseline")


def test_recipes_no_longer_claims_fewer_steps_nor_a_time_ratio():
    text, code = _markdown("Jour3/recipes.ipynb"), _code("Jour3/recipes.ipynb")
    assert "take **fewer steps**" not in text
    assert "time_vs_baseline" not in code and "claims.steps_sentence(" in code


def test_the_ema_window_sentence_follows_the_counts():
    """recipes once said "the EMA's window must fit the (now fewer) steps" of a combined run that took 40 steps
    against the baseline's 24: the sentence is now written from the counted steps."""
    s = claims.ema_window_sentence("all-combined", 40, "baseline", 24, 0.8)
    assert "more steps than baseline (24)" in s and "fewer" not in s and "about 5 steps, 13% of its steps" in s
    assert "fewer steps than baseline (1568)" in claims.ema_window_sentence("all-combined", 1392, "baseline", 1568, 0.99)
    assert "as many steps as baseline" in claims.ema_window_sentence("x", 24, "baseline", 24, 0.9)
    text, code = _markdown("Jour3/recipes.ipynb"), _code("Jour3/recipes.ipynb")
    assert "(now fewer) steps" not in text and "claims.ema_window_sentence(" in code


@pytest.mark.parametrize("path", _results("recipes") or [None], ids=str)
def test_the_steps_sentence_of_a_results_json_is_its_counts(path):
    if path is None:
        pytest.skip("no recipes results.json under runs/ or $DLO_RUNS_DIR yet")
    results = _load(path)
    if "steps_sentence" not in results:
        pytest.skip(f"{path}: written before the sentence was generated")
    steps = {r["recipe"]: r["steps"] for r in results["runs"] if r["recipe"] != "baseline + TTA"}
    assert results["steps_sentence"] == claims.steps_sentence(steps, "baseline")


# --- DataLoader -----------------------------------------------------------------------------------------------

def _m(name, per_call_s, n=12, spread=0.01):
    times = [per_call_s * (1 + spread * ((i * 7) % 5 - 2) / 2) for i in range(n)]
    return Measurement(name=name, times_s=times, items_per_call=64, steady=True)


def test_a_negligible_wait_keeps_the_cheapest_and_says_no_difference():
    ms = {"workers=1, prefetch=1": _m("a", 0.100), "workers=2, prefetch=2": _m("b", 0.099),
          "workers=0": _m("c", 0.101)}
    cost = {"workers=0": (0, 0), "workers=1, prefetch=1": (1, 1), "workers=2, prefetch=2": (2, 2)}
    kept, s = keep_sentence(ms, cost, wait_fraction=0.01)
    assert kept == "workers=0" and "No difference beyond the noise" in s and "fastest" not in s


def test_a_real_wait_keeps_the_cheapest_setting_that_is_not_slower():
    cost = {"workers=0": (0, 0), "workers=1, prefetch=2": (1, 2), "workers=2, prefetch=2": (2, 2)}
    ms = {"workers=0": _m("a", 0.300), "workers=1, prefetch=2": _m("b", 0.1005),
          "workers=2, prefetch=2": _m("c", 0.100)}
    kept, s = keep_sentence(ms, cost, wait_fraction=0.6)
    assert kept == "workers=1, prefetch=2" and "workers=0: slower" in s
    ms["workers=1, prefetch=2"] = _m("b", 0.150)
    kept, s = keep_sentence(ms, cost, wait_fraction=0.6)
    assert kept == "workers=2, prefetch=2" and "slower beyond the noise" in s
    shaky = {k: Measurement(k, [t * (1 + 0.05 * (2 - c[0])) for t in (0.1, 0.3, 0.1, 0.3, 0.2)], 64, steady=True)
             for k, c in cost.items()}  # a spread of 100 %: unsteady; the most workers have the highest median
    kept, s = keep_sentence(shaky, cost, wait_fraction=0.6)
    assert kept == "workers=0" and "by default" in s and "could not be told apart" in s


class _Recorder:
    def __init__(self, name, log, n=3):
        self.name, self.log, self.n = name, log, n

    def __iter__(self):
        self.log.append(self.name)
        return iter(range(self.n))


def test_epoch_starts_are_taken_in_turns():
    log = []
    out = epoch_starts_interleaved({"a": _Recorder("a", log), "b": _Recorder("b", log)}, n_epochs=4)
    assert log == ["a", "b", "b", "a", "a", "b", "b", "a"]
    assert [len(v) for v in out.values()] == [4, 4]
    with pytest.raises(ValueError, match="n_epochs"):
        epoch_starts_interleaved({"a": [1]}, n_epochs=1)


def test_the_dataloader_notebook_decides_with_interleaved_repeats():
    code = _code("Jour2/dataloader.ipynb")
    assert "dl.compare_settings(" in code and "dl.keep_sentence(" in code and "dl.best_setting(" not in code
    assert 'n_epochs=S["persist_epochs"]' in code and "n_epochs=3" not in code


# --- zero_grad ------------------------------------------------------------------------------------------------

class _Watching(torch.optim.SGD):
    """Records, at each zero_grad, whether every parameter had a gradient to clear."""

    def __init__(self, params):
        super().__init__(params, lr=0.1)
        self.seen = []

    def zero_grad(self, set_to_none=True):
        self.seen.append((set_to_none, all(p.grad is not None for g in self.param_groups for p in g["params"])))
        super().zero_grad(set_to_none=set_to_none)


def test_zero_grad_is_timed_on_restored_gradients_in_turns():
    net = torch.nn.Linear(4, 3)
    opt = _Watching(net.parameters())
    ms = time_zero_grad(opt, repeats=4, warmup=1)
    assert {flag: len(m.times_s) for flag, m in ms.items()} == {False: 4, True: 4}
    timed = opt.seen[-8:]
    assert all(had for _, had in timed), "a timed zero_grad found no gradient to clear: they were not restored"
    assert sorted(flag for flag, _ in timed) == [False] * 4 + [True] * 4
    assert all(p.grad is None for p in net.parameters())


def test_the_share_sentence_reads_the_two_calls_against_a_step():
    ms = {True: Measurement("t", [1e-5] * 5, 1), False: Measurement("f", [2.4e-4] * 5, 1)}
    s = share_sentence(ms, 0.4)
    assert "0.01 ms" in s and "0.24 ms" in s and "400 ms" in s and "0.057 % of a step" in s
    assert "faster" not in s


def test_jour1_times_zero_grad_itself():
    code = _code("Jour1/jour1.ipynb")
    assert "time_zero_grad(" in code and "step_zero(" not in code


# --- attention ------------------------------------------------------------------------------------------------

def test_attention_flags_unsteady_points_in_its_plot_and_table():
    code = _code("tp_tensor_parallel/attention.ipynb")
    assert 'hatch="////"' in code and "no ratio" in code and '"unsteady"' in code


@pytest.mark.parametrize("path", _results("attention") or [None], ids=str)
def test_attention_s_unsteady_list_is_its_timings(path):
    if path is None:
        pytest.skip("no attention results.json under runs/ or $DLO_RUNS_DIR yet")
    results = _load(path)
    if "unsteady_timings" not in results:
        pytest.skip(f"{path}: written before unsteady timings were listed")
    want = [f"{name} at S={seq}" for seq, ms in results["timings"].items() for name, m in ms.items()
            if not m["steady"]]
    assert sorted(results["unsteady_timings"]) == sorted(want)
    assert all(math.isfinite(1.0) for _ in want)


# --- hpo: Population Based Training -------------------------------------------------------------------------
def test_hpo_runs_pbt_synchronously():
    """Asynchronous PBT ranks a trial against the others' latest results: where trials run one after another (2
    cores, 2 CPUs per trial, the dry profile) the first has no one to copy and the dry rehearsal made no exploit."""
    calls = re.findall(r"pbt_scheduler\(.*?\n\s*grid, ", _code("Jour4/hpo.ipynb"), re.S)
    assert calls and all("synch=True" in call for call in calls)


@pytest.mark.parametrize("path", _results("hpo") or [None], ids=str)
def test_pbt_of_a_results_json_exploited(path):
    """'PBT made N exploit/explore step(s)': synchronous PBT with at least 2 trials and a checkpoint epoch before
    the last one copies a trial at every such epoch, on any machine."""
    if path is None:
        pytest.skip("no hpo results.json under runs/ or $DLO_RUNS_DIR yet")
    results = _load(path)
    if "pbt_exploits" not in results:
        pytest.skip(f"{path}: Ray did not run PBT there ({results.get('ray_start')})")
    settings = results["settings"]
    if settings["pbt_population"] >= 2 and settings["tune_epochs"] > 2:
        assert len(results["pbt_exploits"]) >= 1, f"{path}: PBT made no exploit step"
