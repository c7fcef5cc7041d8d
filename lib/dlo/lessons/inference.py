"""Making a trained model cheaper to run: distillation, quantization, pruning, the KV cache.

The helpers of ``Jour4/inference.ipynb``, each small enough to read:

- :func:`distillation_loss`: Hinton et al. (2015)'s loss, the reference the notebook's exercise is checked
  against; :func:`fit_classifier`, a plain training loop whose loss is a parameter (so that the student
  trained alone and the student trained by a teacher differ by their loss only), and
  :func:`teacher_logits_table`, a frozen teacher's logits computed once for every training image.
- :func:`model_size_bytes`: the bytes of a model's serialized ``state_dict`` (what a checkpoint weighs
  on disk), the same for a float model and a quantized one.
- :func:`sparsity` / :func:`layer_sparsity`, :func:`prune_global`, :func:`mask_2_4`, :func:`prune_2_4`:
  magnitude pruning with ``torch.nn.utils.prune``, and the 2:4 pattern that sparse tensor cores accelerate.
- :func:`greedy_generate`, :func:`decode_step_times`, :func:`kv_cache_bytes`, :func:`cache_nbytes`: greedy
  decoding written out with and without ``past_key_values``, the time of one decoding step at a given
  context length, and the memory the cache takes (formula and measured).
"""
from __future__ import annotations

import copy
import io
import statistics
import time
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import prune

from dlo.runtime.device import synchronize
from dlo.data.loaders import Batches
from dlo.training.config import TrainConfig
from dlo.training.loop import train

PRUNABLE = (nn.Conv2d, nn.Linear)


# --------------------------------------------------------------------------------------------------
# Distillation
# --------------------------------------------------------------------------------------------------

def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                      T: float = 4.0, alpha: float = 0.5) -> torch.Tensor:
    """``alpha · T² · KL(p_teacher^T ‖ p_student^T) + (1 − alpha) · CE(student, labels)``.

    ``p^T = softmax(logits / T)``: a temperature ``T > 1`` flattens the teacher's distribution, so the
    small probabilities it gives the wrong classes ("this 3 looks a bit like an 8") carry signal. The
    gradient of the soft term scales as ``1 / T²``; multiplying by ``T²`` keeps its weight against the
    hard cross-entropy the same whatever ``T`` (Hinton et al. 2015, section 2). The KL is a mean over the
    batch of a sum over classes (``reduction="batchmean"``: the true KL divergence). The teacher is not
    trained: its logits are detached, so no gradient flows into it.
    """
    if T <= 0:
        raise ValueError(f"the temperature T must be > 0, got {T}")
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha weighs the soft term against the hard one: it must be in [0, 1], got {alpha}")
    log_p_student = F.log_softmax(student_logits / T, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.detach() / T, dim=-1)
    soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * (T * T)
    hard = F.cross_entropy(student_logits, labels)
    return alpha * soft + (1.0 - alpha) * hard


@torch.no_grad()
def accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, batch_size: int = 256) -> float:
    """Top-1 accuracy of ``model`` (in eval mode for the call) on tensors already on its device."""
    was_training = model.training
    model.eval()
    correct = 0
    for i in range(0, len(images), batch_size):
        correct += (model(images[i:i + batch_size]).argmax(1) == labels[i:i + batch_size]).sum().item()
    model.train(was_training)
    return correct / len(images)


def teacher_logits_table(teacher: nn.Module, images: torch.Tensor, batch_size: int = 256) -> dict[bool, torch.Tensor]:
    """A frozen teacher's logits for every image and for its mirror image, ``{flipped: logits [N, classes]}``,
    in fp32: the teacher runs once over the data instead of once per training step (what
    :func:`fit_classifier`'s ``index`` and ``flipped`` arguments are for)."""
    return {flipped: predict_logits(teacher, images.flip(-1) if flipped else images, batch_size).float()
            for flipped in (False, True)}


@torch.no_grad()
def predict_logits(model: nn.Module, images: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    """Logits of ``model`` in eval mode on ``images``, batch by batch."""
    was_training = model.training
    model.eval()
    out = torch.cat([model(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])
    model.train(was_training)
    return out


def fit_classifier(model: nn.Module, images: torch.Tensor, labels: torch.Tensor,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor], *,
                   epochs: int, batch_size: int = 64, lr: float = 0.05, seed: int = 0,
                   eval_data: tuple[torch.Tensor, torch.Tensor] | None = None,
                   progress: str | None = None) -> list[dict[str, Any]]:
    """Train ``model`` in place with SGD (momentum 0.9, weight decay 5e-4, cosine decay) on tensors, with the
    package's one loop (:func:`dlo.training.loop.train`); returns one record per epoch (mean training loss, and
    test accuracy when ``eval_data`` is given).

    At each step ``loss_fn(logits, labels, index, flipped)`` gives the loss: ``index`` holds the positions of
    the batch's images in ``images`` and ``flipped`` says whether the batch was mirrored (the only
    augmentation: a random horizontal flip of the whole batch), so that a loss can look up per-image data
    computed once, such as a frozen teacher's logits. Two calls with the same ``seed`` see the same batches
    in the same order: with the same initial weights, runs that differ by their ``loss_fn`` only differ by it.
    ``images`` / ``labels`` are already on the model's device (a small dataset preloaded once).
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be >= 1, got {epochs}")
    steps_per_epoch = len(images) // batch_size
    if steps_per_epoch < 1:
        raise ValueError(f"{len(images)} images make no full batch of {batch_size}")

    def epoch_batches(gen: torch.Generator):
        order = torch.randperm(len(images), generator=gen).to(images.device)
        for s in range(steps_per_epoch):
            idx = order[s * batch_size:(s + 1) * batch_size]
            flipped = bool(torch.rand((), generator=gen) < 0.5)
            x = images[idx].flip(-1) if flipped else images[idx]
            yield x, (labels[idx], idx, flipped)

    def make_loader(gen: torch.Generator) -> Batches:
        return Batches(lambda: epoch_batches(gen), steps_per_epoch)

    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=5e-4)
    cfg = TrainConfig(epochs=epochs, lr=lr, schedule="warmup_cosine", seed=seed, progress=progress is not None,
                      log_every=epochs * steps_per_epoch + 1)
    val = None
    if eval_data is not None:
        x_val, y_val = eval_data
        val = [(x_val[i:i + 256], y_val[i:i + 256]) for i in range(0, len(y_val), 256)]
    result = train(model, make_loader, cfg, images.device, val_loader=val, optimizer=optimizer,
                   criterion=lambda logits, t: loss_fn(logits, t[0], t[1], t[2]))
    records = []
    for r in result.records:
        if r["event"] == "epoch":
            rec = {"epoch": r["epoch"] + 1, "train_loss": r["train_loss"]}
            if eval_data is not None:
                rec["test_accuracy"] = r["val_accuracy"]
            records.append(rec)
    return records


# --------------------------------------------------------------------------------------------------
# Size
# --------------------------------------------------------------------------------------------------

def model_size_bytes(model: nn.Module) -> int:
    """Bytes of ``torch.save(model.state_dict())``: what the model weighs as a checkpoint.

    Counting ``p.numel() * p.element_size()`` over ``parameters()`` would miss a dynamically quantized
    Linear, whose int8 weight is no longer a parameter (it lives packed in the module's state); the
    serialized state dict holds everything a reload needs, whatever the module.
    """
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    return buf.getbuffer().nbytes


# --------------------------------------------------------------------------------------------------
# Pruning
# --------------------------------------------------------------------------------------------------

def prunable(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The ``(name, module)`` pairs whose ``weight`` pruning concerns: every Conv2d and Linear."""
    return [(name, m) for name, m in model.named_modules() if isinstance(m, PRUNABLE)]


def layer_sparsity(model: nn.Module) -> dict[str, float]:
    """Fraction of zeros in each prunable layer's ``weight`` (the masked weight when a mask is attached)."""
    return {name: (m.weight == 0).float().mean().item() for name, m in prunable(model)}


def sparsity(model: nn.Module) -> float:
    """Fraction of zeros among all the weights of the Conv2d and Linear layers taken together (biases and
    norm layers excluded). ``m.weight`` is read, not the parameters: after ``prune.*`` and before
    ``prune.remove`` the parameter is ``weight_orig`` (untouched) and ``weight = weight_orig * weight_mask``."""
    zeros = total = 0
    for _, m in prunable(model):
        zeros += int((m.weight == 0).sum())
        total += m.weight.numel()
    if total == 0:
        raise ValueError("the model has no Conv2d or Linear layer")
    return zeros / total


def prune_global(model: nn.Module, amount: float, *, make_permanent: bool = True) -> nn.Module:
    """Global magnitude pruning, in place: zero the ``amount`` fraction of smallest-|w| weights taken over
    all Conv2d and Linear layers together (``prune.global_unstructured`` with ``L1Unstructured``), so
    layers with many small weights lose more. ``make_permanent``: ``prune.remove`` folds each mask into
    the weight (plain tensors with zeros, no ``weight_orig`` / ``weight_mask`` left)."""
    if not 0.0 <= amount < 1.0:
        raise ValueError(f"amount is the fraction of weights to remove, in [0, 1), got {amount}")
    params = [(m, "weight") for _, m in prunable(model)]
    if amount > 0:
        prune.global_unstructured(params, pruning_method=prune.L1Unstructured, amount=amount)
        if make_permanent:
            for m, name in params:
                prune.remove(m, name)
    return model


def mask_2_4(weight: torch.Tensor) -> torch.Tensor:
    """The 2:4 mask of a weight: in every group of 4 consecutive input weights of a row (the layout sparse
    tensor cores read), keep the 2 of largest magnitude. A Conv2d weight ``[out, in, kh, kw]`` is seen as
    ``[out, in·kh·kw]``, which must be a multiple of 4."""
    rows = weight.detach().reshape(weight.shape[0], -1)
    if rows.shape[1] % 4:
        raise ValueError(f"2:4 sparsity needs rows of a multiple of 4 weights, this weight has rows of {rows.shape[1]}")
    groups = rows.abs().reshape(rows.shape[0], -1, 4)
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.reshape(weight.shape)


def prune_2_4(model: nn.Module, *, make_permanent: bool = True) -> list[str]:
    """Apply :func:`mask_2_4` to every prunable layer whose rows are a multiple of 4 (``prune.custom_from_mask``,
    then ``prune.remove`` when ``make_permanent``; keep the masks to fine-tune with the pattern enforced).
    Returns the names of the layers left dense (e.g. a first conv with 3·3·3 = 27 weights per row)."""
    skipped = []
    for name, m in prunable(model):
        if m.weight[0].numel() % 4:
            skipped.append(name)
            continue
        prune.custom_from_mask(m, "weight", mask_2_4(m.weight))
        if make_permanent:
            prune.remove(m, "weight")
    return skipped


def remove_masks(model: nn.Module) -> nn.Module:
    """``prune.remove`` on every layer that carries a pruning mask: the zeros become part of the weights."""
    for _, m in prunable(model):
        if hasattr(m, "weight_mask"):
            prune.remove(m, "weight")
    return model


# --------------------------------------------------------------------------------------------------
# KV cache
# --------------------------------------------------------------------------------------------------

def kv_cache_bytes(num_layers: int, num_kv_heads: int, head_dim: int, seq_len: int, batch: int = 1,
                   bytes_per_value: int = 2) -> int:
    """Memory of a KV cache: ``2 (K and V) × layers × kv_heads × head_dim × seq_len × batch × bytes``."""
    return 2 * num_layers * num_kv_heads * head_dim * seq_len * batch * bytes_per_value


def cache_nbytes(past_key_values: Any) -> int:
    """Bytes held by the key and value tensors of a transformers cache (``DynamicCache``: ``.layers[i].keys`` /
    ``.values``), or of the legacy tuple of ``(key, value)`` pairs."""
    layers = getattr(past_key_values, "layers", None)
    if layers is not None:
        pairs = [(layer.keys, layer.values) for layer in layers]
    else:
        pairs = list(past_key_values)
    return sum(t.numel() * t.element_size() for pair in pairs for t in pair if t is not None)


@torch.inference_mode()
def greedy_generate(model: nn.Module, input_ids: torch.Tensor, max_new_tokens: int,
                    use_cache: bool = True) -> torch.Tensor:
    """Greedy decoding written out. Without cache, every step runs the model on the *whole* sequence so far;
    with it, the prompt runs once (the "prefill") and each step feeds only the newest token, the keys and
    values of the previous ones coming from ``past_key_values``. Returns prompt + new tokens."""
    ids = input_ids
    if use_cache:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
        cache = out.past_key_values
        for i in range(max_new_tokens):
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            ids = torch.cat([ids, nxt], dim=1)
            if i + 1 < max_new_tokens:
                out = model(input_ids=nxt, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return ids
    for _ in range(max_new_tokens):
        logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits
        ids = torch.cat([ids, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@torch.inference_mode()
def decode_step_times(model: nn.Module, context_lengths: Iterable[int], *, use_cache: bool, vocab_size: int,
                      batch: int = 1, warmup: int = 1, repeats: int = 5, device: torch.device | str = "cpu",
                      seed: int = 0, progress: str | None = None) -> list[dict[str, Any]]:
    """Time of one decoding step (producing one token) when the context already holds ``L`` tokens, for each
    ``L``: without cache, a forward over all ``L + 1`` tokens; with cache, a forward over the one new token
    with the ``L`` previous keys and values cached (the prefill that fills the cache is not timed, and each
    timed step starts from a fresh copy of it). Synchronised, warm-up excluded, median of ``repeats``."""
    from tqdm.auto import tqdm

    device = torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    lengths = list(context_lengths)
    records = []
    for L in tqdm(lengths, desc=progress, leave=False, disable=progress is None):
        ids = torch.randint(0, vocab_size, (batch, L + 1), generator=gen).to(device)
        cached = model(input_ids=ids[:, :L], use_cache=True, logits_to_keep=1).past_key_values if use_cache else None
        times = []
        for i in range(warmup + repeats):
            cache = copy.deepcopy(cached) if use_cache else None
            synchronize(device)
            t0 = time.perf_counter()
            if use_cache:
                model(input_ids=ids[:, L:], past_key_values=cache, use_cache=True, logits_to_keep=1)
            else:
                model(input_ids=ids, use_cache=False, logits_to_keep=1)
            synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
        records.append({"context": L, "use_cache": use_cache, "median_s": statistics.median(times),
                        "repeats": repeats, "cache_bytes": cache_nbytes(cached) if use_cache else 0})
    return records


__all__ = [
    "PRUNABLE", "distillation_loss", "accuracy", "predict_logits", "teacher_logits_table", "fit_classifier",
    "model_size_bytes", "prunable", "layer_sparsity", "sparsity", "prune_global", "mask_2_4", "prune_2_4", "remove_masks",
    "kv_cache_bytes", "cache_nbytes", "greedy_generate", "decode_step_times",
]
