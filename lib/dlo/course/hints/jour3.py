"""Goals and hints of Jour 3 (jit, optimizers, recipes, transfer): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour3
    ("optimizers", "warmup"): _h(
        "Give the learning rate of a step: a linear warm-up to the base rate, then half a cosine down to zero at "
        "the last step.",
        "The warm-up should not waste step 0 with a zero rate; the cosine covers only the steps after the warm-up.",
        "math.cos, math.pi; the fraction of the post-warm-up steps already done.",
        shape="Two regimes split at the end of the warm-up. Before it, the rate is a fraction of the base rate that "
        "grows by the same amount each step, counted so that step 0 already has one increment. After it, first "
        "measure how far along the remaining steps you are (a fraction from 0 to 1), turn that fraction into an angle "
        "from 0 to a half turn, and map the angle's cosine from [1, -1] onto [base rate, 0]."),
    ("optimizers", "lion"): _h(
        "Compute one Lion update: new weights and new momentum, as new tensors.",
        "Lion steps by the sign of an interpolation between the momentum and the current gradient (with beta1), "
        "then updates the momentum with beta2; weight decay is decoupled.",
        "torch.sign, torch.lerp (or the blends written with * and +), Tensor.mul and Tensor.sub (out of place); "
        "dlo.training.optim.Lion.step for the reference.",
        shape="Three quantities, in this order: a blend of the old momentum and the gradient (weighted by the first "
        "beta), whose sign alone is kept; the new weights, from the old weights shrunk by the decoupled decay, minus "
        "the learning rate times that sign; the new momentum, a second blend of the old momentum and the gradient, "
        "weighted by the second beta. Each is a new tensor: none of the inputs is written into."),
    ("optimizers", "accumulate"): _h(
        "Accumulate gradients over k micro-batches so that they equal the gradient of the whole batch, without an "
        "optimizer step.",
        "Each micro-batch's mean loss must be weighted by its share of the batch: micro-batches can differ in size.",
        "Tensor.chunk(k), backward() on each weighted loss; return the total loss as a float.",
        shape="Loop over the k pieces of the batch, images and labels cut the same way. For each: forward, its mean "
        "loss, scaled by the piece's share of the whole batch, then backward (gradients add up in .grad across the "
        "pieces). Keep a running sum of the scaled losses as plain numbers: after the loop it is the whole batch's "
        "mean loss."),
    ("optimizers", "finder_restore"): _h(
        "Save everything the LR finder's sweep changes and put it back exactly afterwards, so that training after "
        "the finder is the training you would have had without it.",
        "A sweep moves the weights and BatchNorm statistics, charges the optimizer's momentum / Adam moments and "
        "step counts, leaves its lr in the param groups, advances a scheduler, switches modes and consumes random "
        "numbers. state_dict() hands out the live tensors, and load_state_dict keeps the tensors it is given: what "
        "you save and what you restore must both be copies.",
        "tensor.clone(), copy.deepcopy(optimizer.state_dict()) and of scheduler.state_dict(), model.load_state_dict, "
        "optimizer.load_state_dict, module.training over model.modules(), dlo.training.checkpoint.rng_state / "
        "set_rng_state.",
        shape="Saving: build one record holding independent copies of every piece of state the sweep touches (weights "
        "and buffers, gradients, the optimizer's and scheduler's states, each module's mode, the random generators). "
        "Restoring: write each piece back into the live objects (values into the same parameter tensors, the "
        "optimizer reloaded from a fresh copy of its saved state so that the saved record itself is never handed "
        "over), then the modes, then the generators last."),
    ("recipes", "resize"): _h(
        "Give the image resolution to train at for an epoch, from a progressive-resizing schedule.",
        "The schedule is a list of (start epoch, size): the last entry that has started applies.",
        "A loop over the (start, size) pairs keeping the last one with start <= epoch.",
        shape="The schedule is read in order; the answer is the size of the last pair whose start epoch is not after "
        "the epoch asked for. Nothing is sorted by size: a schedule may go down again."),
    ("recipes", "ema"): _h(
        "Update an exponential moving average of a model's weights (and BatchNorm buffers) after a step.",
        "The average keeps most of itself (the decay) and moves a little towards the current weights.",
        "A list with one new tensor per pair (ema, current): decay multiplies the average; torch.lerp does the same.",
        shape="Tensor by tensor, in the same order as the list: the new average is mostly the old average and a little "
        "of the current tensor (the decay sets the split). The current tensors are only read, and each result keeps "
        "the average's own dtype."),
    ("recipes", "tta"): _h(
        "Predict with test-time augmentation: average the predicted probabilities of the image and its mirror.",
        "Averaging over augmented views smooths the prediction; average probabilities, not logits.",
        "torch.flip on the width axis, softmax, mean of the two.",
        shape="Two views of each image: the image itself and its left-right mirror (the width axis). For each view, "
        "the model's logits become probabilities over the classes; the answer is the mean of the two probability "
        "tables, one row per image."),
    ("transfer", "head"): _h(
        "Replace the pretrained classifier by a new head of the right size and freeze the backbone.",
        "Only the new head should learn at first: the backbone's parameters must not receive gradients.",
        "nn.Linear(in_features, num_classes), requires_grad_(False) on the backbone's parameters.",
        shape="Replacing: read the old head's input size, build a new linear layer from that size to the number of "
        "classes, put it where the old head was, and return the same model. Freezing: mark every parameter as not "
        "needing gradients, then mark the head's parameters as needing them again."),
    ("transfer", "groups"): _h(
        "Fine-tune with two learning rates: small for the pretrained backbone, full for the new head.",
        "Pretrained weights need only small corrections; the new head starts from scratch.",
        "Optimizer parameter groups: a list of dicts with 'params' and 'lr'.",
        shape="Collect the head's parameters, then every other parameter of the model (compare by identity), each as a "
        "real list; return two groups, each pairing its list with its own learning rate."),
    ("jit", "graph_break"): _h(
        "Rewrite gradient clipping so that torch.compile captures it in one graph, with the same values.",
        "Converting a tensor to a Python number (.item(), if on a tensor) forces a graph break; tensor operations "
        "do not.",
        "torch.clamp / torch.where instead of Python branches; torch._dynamo.explain to count the breaks.",
        shape="Compute the norm as a tensor, then a scale factor as a tensor: the ratio of max_norm to the norm, "
        "capped at 1 by a tensor operation. Multiply x by the factor. No value ever leaves the tensor world (no "
        "Python number, no branch on a tensor)."),
    ("jit", "compiled_step"): _h(
        "Build a training step compiled once and reused, equal to the eager step.",
        "Compile the function that does forward, loss, backward and update, not a new model every call.",
        "torch.compile on the step function (or the model), created once and returned.",
        shape="Inside the builder, define a step of (images, labels) that does, in order: forward, loss, clear the "
        "gradients, backward, optimizer step, and returns the loss without its graph. Compile that step once, with "
        "the options the caller passed, and return the compiled function."),
}
