"""Jour 1's generated cases reach what the checkers' verdicts depend on: a batch of 1, bf16 and fp16, GradScaler
scales that overflow float16 (the reference skips those steps and lowers the scale) and scales that do not, clipping
thresholds on both sides of the gradient norm, batches of different sizes, degenerate channels_last shapes."""
import torch

from dlo.course.checks import jour1_cases as C, jour1_models as M, jour1_precision as P, jour1_tools as T


def test_training_step_cases_cover_sizes_dtypes_and_scales():
    specs = [c.kwargs["spec"] for c in P.AMP_CASES]
    assert {s["dtype"] for s in specs} == {torch.bfloat16, torch.float16}
    assert 1 in {s["n"] for s in specs} and any(s["n"] % 2 for s in specs if s["n"] > 1)
    assert {s["kind"] for s in specs} == {"conv", "linear"} and {s["criterion"] for s in specs} == {"ce", "smooth"}
    clips = {c.kwargs["spec"]["clip"] for c in P.CLIP_CASES}
    assert min(clips) < 1 < max(clips)  # clipped and left alone


def test_an_overflowing_scale_skips_the_step_and_lowers_the_scale():
    states = {}
    for case in P.FP16_CASES:
        s = case.kwargs["spec"]
        run, state = C.run_steps(P.reference_fp16, s, P._fp16_call)
        before = C.make_model(s["kind"], s["width"], s["norm"], s["dropout"], s["seed"], s["classes"], s["side"])
        moved = any(not torch.equal(p, q) for p, q in zip(run.model.parameters(), before.parameters()))
        states[s["init_scale"] in P.OVERFLOW] = states.get(s["init_scale"] in P.OVERFLOW, set()) | {moved}
        scale = state["the scaler's scale after step 2"]
        assert scale < s["init_scale"] if s["init_scale"] in P.OVERFLOW else scale > s["init_scale"]
    assert states == {True: {False}, False: {True}}


def test_evaluation_layout_and_sweep_cases_reach_their_edges():
    sizes = [c.kwargs["spec"]["sizes"] for c in M.EVAL_CASES]
    assert [1] in sizes and any(len(set(s)) > 1 for s in sizes) and any(len(s) > 1 and len(set(s)) == 1 for s in sizes)
    shapes = [c.kwargs["spec"]["shape"] for c in M.CL_CASES]
    assert any(s[1] == 1 for s in shapes) and any(s[2] * s[3] == 1 for s in shapes) and any(s[0] == 1 for s in shapes)
    sweeps = [(len(c.kwargs["sizes"]), c.kwargs["oom_at"]) for c in T.SWEEP_CASES if not c.kwargs["bug"]]
    assert any(oom == 0 for _, oom in sweeps) and any(oom == n for n, oom in sweeps)
    assert any(0 < oom < n for n, oom in sweeps)
