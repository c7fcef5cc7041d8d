"""Goals and hints of Jour 3 (jit, optimizers, recipes, transfer): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour3
    ("optimizers", "warmup"): _h(
        "Give the learning rate of a step: a linear warm-up to the base rate, then half a cosine down to zero at "
        "the last step.",
        "The warm-up should not waste step 0 with a zero rate; the cosine covers only the steps after the warm-up.",
        "math.cos, math.pi; the fraction of the post-warm-up steps already done."),
    ("optimizers", "lion"): _h(
        "Compute one Lion update: new weights and new momentum, as new tensors.",
        "Lion steps by the sign of an interpolation between the momentum and the current gradient (with beta1), "
        "then updates the momentum with beta2; weight decay is decoupled.",
        "torch.sign; the interpolation with beta1, the momentum update with beta2, p * (1 - lr * weight_decay)."),
    ("optimizers", "accumulate"): _h(
        "Accumulate gradients over k micro-batches so that they equal the gradient of the whole batch, without an "
        "optimizer step.",
        "Each micro-batch's mean loss must be weighted by its share of the batch: micro-batches can differ in size.",
        "Tensor.chunk(k), backward() on each weighted loss; return the total loss as a float."),
    ("optimizers", "finder_restore"): _h(
        "Save everything the LR finder's sweep changes and put it back exactly afterwards, so that training after "
        "the finder is the training you would have had without it.",
        "A sweep moves the weights and BatchNorm statistics, charges the optimizer's momentum / Adam moments and "
        "step counts, leaves its lr in the param groups, advances a scheduler, switches modes and consumes random "
        "numbers. state_dict() hands out the live tensors, and load_state_dict keeps the tensors it is given: what "
        "you save and what you restore must both be copies.",
        "tensor.clone(), copy.deepcopy(optimizer.state_dict()) and of scheduler.state_dict(), model.load_state_dict, "
        "optimizer.load_state_dict, module.training over model.modules(), dlo.training.checkpoint.rng_state / "
        "set_rng_state."),
    ("recipes", "resize"): _h(
        "Give the image resolution to train at for an epoch, from a progressive-resizing schedule.",
        "The schedule is a list of (start epoch, size): the last entry that has started applies.",
        "A loop over the (start, size) pairs keeping the last one with start <= epoch."),
    ("recipes", "ema"): _h(
        "Update an exponential moving average of a model's weights (and BatchNorm buffers) after a step.",
        "The average keeps most of itself (the decay) and moves a little towards the current weights.",
        "A list with one new tensor per pair (ema, current): decay multiplies the average; torch.lerp does the same."),
    ("recipes", "tta"): _h(
        "Predict with test-time augmentation: average the predicted probabilities of the image and its mirror.",
        "Averaging over augmented views smooths the prediction; average probabilities, not logits.",
        "torch.flip on the width axis, softmax, mean of the two."),
    ("transfer", "head"): _h(
        "Replace the pretrained classifier by a new head of the right size and freeze the backbone.",
        "Only the new head should learn at first: the backbone's parameters must not receive gradients.",
        "nn.Linear(in_features, num_classes), requires_grad_(False) on the backbone's parameters."),
    ("transfer", "groups"): _h(
        "Fine-tune with two learning rates: small for the pretrained backbone, full for the new head.",
        "Pretrained weights need only small corrections; the new head starts from scratch.",
        "Optimizer parameter groups: a list of dicts with 'params' and 'lr'."),
    ("jit", "graph_break"): _h(
        "Rewrite gradient clipping so that torch.compile captures it in one graph, with the same values.",
        "Converting a tensor to a Python number (.item(), if on a tensor) forces a graph break; tensor operations "
        "do not.",
        "torch.clamp / torch.where instead of Python branches; torch._dynamo.explain to count the breaks."),
    ("jit", "compiled_step"): _h(
        "Build a training step compiled once and reused, equal to the eager step.",
        "Compile the function that does forward, loss, backward and update, not a new model every call.",
        "torch.compile on the step function (or the model), created once and returned."),
}
