"""Goals and hints of Jour 4 (race, hpo, inference, llm_memory): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour4
    ("llm_memory", "gqa"): _h(
        "Count an attention block's parameters with grouped-query attention.",
        "Queries and the output projection keep the full width; keys and values have fewer heads.",
        "hidden * num_heads * head_dim for q and o, hidden * num_kv_heads * head_dim for k and v."),
    ("llm_memory", "zero"): _h(
        "Give the bytes of model state per GPU under each ZeRO stage.",
        "Mixed-precision Adam keeps 16 bytes per parameter (weights, gradients, fp32 master and moments); each "
        "stage shards one more kind over the GPUs.",
        "Strategies 'ddp', 'zero1' (optimizer states sharded), 'zero2' (gradients too), 'zero3' (weights too): "
        "divide the sharded bytes by the number of GPUs."),
    ("hpo", "search_space"): _h(
        "Define the trial's hyper-parameters: three of them, named, with log scales where they span decades.",
        "Learning rate and weight decay vary over orders of magnitude: sample them on a log scale.",
        "trial.suggest_float(name, low, high, log=True) and the other suggest_* methods."),
    ("hpo", "report_prune"): _h(
        "Report the validation score after every epoch and stop the trial as soon as the pruner says so.",
        "The pruner compares a trial's intermediate values with the others' at the same step.",
        "trial.report(value, step), trial.should_prune(), raise optuna.TrialPruned()."),
    ("inference", "distillation"): _h(
        "Write the distillation loss: a mix of matching the teacher's softened predictions and the true labels.",
        "The teacher gives soft targets at temperature T (scaled by T² to keep gradients comparable); it is not "
        "trained.",
        "F.kl_div on log_softmax(student / T) and softmax(teacher / T), F.cross_entropy, teacher detached."),
    ("inference", "sparsity"): _h(
        "Measure the fraction of zero weights over all convolution and linear layers together.",
        "Count zeros and elements over every such weight (pruned weights included), then divide once.",
        "model.modules(), isinstance with nn.Conv2d / nn.Linear, (w == 0).sum()."),
    ("race", "time_to_target"): _h(
        "Find the time at which a run first reached the target accuracy, or None if it never did.",
        "The time to target is that of the first evaluation that shows the target, not of the best one.",
        "A loop over the evaluations in order, returning the first time whose accuracy >= target."),
    ("race", "fair_ranking"): _h(
        "Rank an attempt only against the attempts it can fairly be compared with, best first, and refuse when "
        "its record does not say what it can be compared with.",
        "A time to target depends on the target, on the data (real or generated), on how many test images decide "
        "that the target is reached (20 images: 5 points per image, a target crossed by luck) and on the hardware. "
        "Versions are recorded to explain a gap, not to split a group.",
        "A list comprehension keeping the attempts equal to mine on target, data, n_test and hardware (and with "
        "versions); sorted() with a key: reached ones by time_to_target_s, then the rest by -accuracy; "
        "raise ValueError naming the missing fields."),
    ("race", "my_recipe"): _h(
        "Describe your own training recipe for the race, within the allowed settings.",
        "Combine what the course measured: batch size, precision, learning-rate schedule, augmentation.",
        "Return the recipe object the notebook describes, with your chosen fields."),
}
