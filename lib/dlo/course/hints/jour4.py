"""Goals and hints of Jour 4 (race, hpo, inference, llm_memory): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour4
    ("llm_memory", "gqa"): _h(
        "Count an attention block's parameters with grouped-query attention.",
        "Queries and the output projection keep the full width; keys and values have fewer heads.",
        "The four nn.Linear layers of a Llama attention block (q_proj, k_proj, v_proj, o_proj, all bias=False; see "
        "dlo.models.llama): their in_features and out_features; nn.Linear's weight has out * in entries.",
        shape="Four projections, each a weight matrix without bias. Queries and the output projection connect the "
        "hidden size to all query heads' widths; keys and values connect the hidden size to the key/value heads' "
        "widths only. Each head's width is the given head_dim, not hidden divided by a head count. Add the four "
        "counts."),
    ("llm_memory", "zero"): _h(
        "Give the bytes of model state per GPU under each ZeRO stage.",
        "Mixed-precision Adam keeps 16 bytes per parameter (weights, gradients, fp32 master and moments); each "
        "stage shards one more kind over the GPUs.",
        "Strategies 'ddp', 'zero1' (optimizer states sharded), 'zero2' (gradients too), 'zero3' (weights too): "
        "divide the sharded bytes by the number of GPUs.",
        shape="Per parameter, three kinds of state: bf16 weights, bf16 gradients, and the float32 optimizer state "
        "(master weights and two Adam moments). Each strategy decides which kinds are divided by the number of GPUs "
        "and which stay whole; the answer is the sum over the kinds, times the number of parameters."),
    ("hpo", "search_space"): _h(
        "Define the trial's hyper-parameters: three of them, named, with log scales where they span decades.",
        "Learning rate and weight decay vary over orders of magnitude: sample them on a log scale.",
        "trial.suggest_float(name, low, high, log=True) and the other suggest_* methods.",
        shape="One suggestion per hyper-parameter, each under its own name, each with its range and its scale (log for "
        "those that span decades); return a dict that maps each name to the value the trial sampled under that name."),
    ("hpo", "report_prune"): _h(
        "Report the validation score after every epoch and stop the trial as soon as the pruner says so.",
        "The pruner compares a trial's intermediate values with the others' at the same step.",
        "trial.report(value, step), trial.should_prune(), raise optuna.TrialPruned().",
        shape="Loop over the epochs numbered from 1. In each: train one epoch and get its accuracy, tell the trial "
        "that accuracy at that epoch number, then ask the trial whether to stop; if so, stop by the exception Optuna "
        "expects. After the loop, return the last accuracy."),
    ("inference", "distillation"): _h(
        "Write the distillation loss: a mix of matching the teacher's softened predictions and the true labels.",
        "The teacher gives soft targets at temperature T (scaled by T² to keep gradients comparable); it is not "
        "trained.",
        "F.kl_div on log_softmax(student / T) and softmax(teacher / T), F.cross_entropy, teacher detached.",
        shape="Two terms. Soft: both logit sets divided by the temperature and turned into (log-)probabilities, the "
        "teacher's with no gradient; the divergence of the student's from the teacher's, averaged over the batch, "
        "times the temperature squared. Hard: the usual cross-entropy on the true labels, without temperature. Mix "
        "them: alpha on the soft term, the rest on the hard one."),
    ("inference", "sparsity"): _h(
        "Measure the fraction of zero weights over all convolution and linear layers together.",
        "Count zeros and elements over every such weight (pruned weights included), then divide once.",
        "model.modules(), isinstance with nn.Conv2d / nn.Linear, (w == 0).sum().",
        shape="Walk every module, nested ones included; for each convolution or linear layer, add the number of zero "
        "entries of its weight and the weight's size to two running totals. Divide the totals once at the end."),
    ("race", "time_to_target"): _h(
        "Find the time at which a run first reached the target accuracy, or None if it never did.",
        "The time to target is that of the first evaluation that shows the target, not of the best one.",
        "A loop over the evaluations in order, returning the first time whose accuracy >= target.",
        shape="Walk the evaluations in their order, time and accuracy side by side; the first one whose accuracy is at "
        "least the target gives the answer, its time. If none does, the answer is None."),
    ("race", "fair_ranking"): _h(
        "Rank an attempt only against the attempts it can fairly be compared with, best first, and refuse when "
        "its record does not say what it can be compared with.",
        "A time to target depends on the target, on the data (real or generated), on how many test images decide "
        "that the target is reached (20 images: 5 points per image, a target crossed by luck) and on the hardware. "
        "Versions are recorded to explain a gap, not to split a group.",
        "A list comprehension keeping the attempts equal to mine on target, data, n_test and hardware (and with "
        "versions); sorted() with a key: reached ones by time_to_target_s, then the rest by -accuracy; "
        "raise ValueError naming the missing fields.",
        shape="First, refuse when your own record lacks a field that says what it can be compared with. Then keep the "
        "attempts that are complete and equal to yours on each of those fields. Order them in two blocks: those that "
        "reached the target, by time; then the others, by accuracy from high to low. Return their names."),
    ("race", "my_recipe"): _h(
        "Describe your own training recipe for the race, within the allowed settings.",
        "Combine what the course measured: batch size, precision, learning-rate schedule, augmentation.",
        "Return the recipe object the notebook describes, with your chosen fields.",
        shape="Start from the reference recipe, change one or more ingredients you have a reason for (measured in "
        "earlier notebooks), give the result its own name, and return it as a recipe."),
}
