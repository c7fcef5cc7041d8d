"""MixUp and CutMix on a batch, per sample: a readable loop, then the batched version, and why both agree.

MixUp (Zhang et al. 2018) and CutMix (Yun et al. 2019) mix each image with a *partner* from the same
batch and mix the labels in the same proportion, so the network is trained on soft targets.

Our semantics, per sample ``i`` of a batch ``[B, C, H, W]``:

* ``lam_i ~ Beta(alpha, alpha)`` drawn independently for each sample, and a partner ``perm[i]``;
* MixUp: ``x_i' = lam_i * x_i + (1 - lam_i) * x_perm[i]`` and the same for the targets;
* CutMix: a box with side ratio ``sqrt(1 - lam_i)`` is cut out of ``x_i`` and filled with the partner's
  pixels. Box height ``h = floor(H * sqrt(1 - lam_i))`` (truncation, like the CutMix paper's
  ``int(W * cut_rat)``), width ``w = floor(W * sqrt(1 - lam_i))``; the centre ``(cy, cx)`` is a pixel drawn
  uniformly from ``{0..H-1} x {0..W-1}``; the box is rows ``[cy - h//2, cy - h//2 + h)`` and columns
  ``[cx - w//2, cx - w//2 + w)``, clipped to the image. Near a border the clipped box is smaller than
  drawn, so the label weight is *recomputed* from the area actually pasted:
  ``lam_label_i = 1 - area_i / (H * W)``. The fraction of pixels taken from the partner is then exactly
  ``1 - lam_label_i``: the label says what the image shows.

Why a random single-cycle partner permutation: ``torch.randperm`` leaves on average one sample per batch
paired with itself (nothing is mixed, yet it costs a slot), and torchvision's ``batch.roll(1, 0)`` pairs
fixed neighbours, so it relies on the loader shuffling. We shuffle the batch order and roll that order:
every sample gets a partner other than itself (for ``B > 1``), each sample is used once as a partner.

Why per-sample ``lam``: ``torchvision.transforms.v2.MixUp`` / ``CutMix`` draw ONE ``lam`` (and one box)
for the whole batch; every image of a step then gets the same mixing strength, and with ``alpha < 1``
a whole step is often almost unmixed or heavily mixed. Per-sample draws give each image its own
strength, so every step sees the whole range (timm's ``mode="elem"``). ``per_sample=False`` reproduces
the shared draw for comparison.

Differences from torchvision (0.28, ``transforms/v2/_augment.py``), documented and tested:

1. One ``lam`` / one box per batch there; per sample here (``per_sample=False`` for theirs).
2. Partner ``batch.roll(1, 0)`` there (``perm[i] = i - 1``); a random single cycle here.
3. CutMix box: torchvision uses a half side ``int(0.5 * sqrt(1 - lam) * H)`` around the centre, i.e. the
   unclipped box is ``2 * int(0.5 * r * H)`` rows, always even and up to one pixel shorter than ours
   ``int(r * H)`` (we allow odd sizes). When ``int(r * H)`` is even, both give the same box for the same
   centre. Both recompute the label weight from the clipped area. Given the same ``lam``, partner and
   box, our outputs equal theirs exactly, images and labels (float32; tested).
4. MixUp in low precision (bfloat16 / float16): we compute in float32 and round once; torchvision
   computes in the image dtype (three roundings). float32 results are identical.
5. Sampling ``lam``: ``torch.distributions.Beta`` draws two gamma variables and divides. For tiny
   ``alpha`` (about 1e-3) both underflow, get clamped to the same tiny number, and about a quarter of the
   draws come out as exactly 0.5 instead of near 0 or 1. We draw in log space
   (``Gamma(a) = Gamma(a + 1) * U**(1/a)``, ``lam = sigmoid(log G1 - log G2)``), which stays correct,
   and with a ``torch.Generator`` so that results are reproducible. For usual alphas both samplers give
   the same distribution (tested at 0.2, 0.3 and 1).

The ``*_reference`` functions loop over the images in Python: the version to read first. The batched
``mixup`` / ``cutmix`` do the same with a handful of tensor operations on the whole batch (no Python loop
over images, no host-device synchronisation), which is what to use in training; :func:`benchmark` measures
the difference (``python -m dlo mix-bench --device auto``).

Random draws all happen in :func:`sample_mix_params`, on the CPU (``B`` numbers, negligible), then move to
the images' device. Applying the mix is deterministic given a :class:`MixParams`, which is what lets the
loop, the batched version and torchvision be compared exactly.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from dlo.data.soft_targets import _compute_dtype, _is_label_vector, soft_accuracy, soft_cross_entropy, to_soft_targets

KINDS = ("mixup", "cutmix")


# --------------------------------------------------------------------------------------------------
# Parameters: every random draw happens here
# --------------------------------------------------------------------------------------------------

@dataclass
class MixParams:
    """Everything random about one MixUp / CutMix call, so that applying it is deterministic.

    * ``lam``: float64 ``[B]``, the weight of each sample's *own* label (and, for MixUp, of its own pixels).
      For CutMix it is the area-based label weight ``1 - area / (H * W)`` of the clipped box. Kept in
      float64 so that ``1 - lam`` is computed before rounding to the data's dtype (see :func:`mix_weights`).
    * ``perm``: int64 ``[B]``, sample ``i`` is mixed with sample ``perm[i]``.
    * ``boxes``: int64 ``[B, 4]`` as ``(y0, y1, x0, x1)``, half-open (rows ``y0 <= y < y1``), or ``None``
      for MixUp.
    * ``lam_drawn``: float64 ``[B]``, the Beta draw before CutMix's box rounding and clipping
      (informative; ``None`` when the params were built by hand).
    """

    lam: torch.Tensor
    perm: torch.Tensor
    boxes: torch.Tensor | None = None
    lam_drawn: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.lam.ndim != 1 or self.perm.shape != self.lam.shape:
            raise ValueError(f"lam and perm must both have shape [B], got {tuple(self.lam.shape)} and "
                             f"{tuple(self.perm.shape)}")
        if self.boxes is not None and tuple(self.boxes.shape) != (len(self.lam), 4):
            raise ValueError(f"boxes must have shape [B, 4] = [{len(self.lam)}, 4], got {tuple(self.boxes.shape)}")

    def __len__(self) -> int:
        return len(self.lam)

    @property
    def kind(self) -> str:
        return "mixup" if self.boxes is None else "cutmix"

    def to(self, device: torch.device | str) -> "MixParams":
        """A copy on ``device`` (no copy when already there).

        Towards a GPU the copy is ``non_blocking``: a plain ``.to("cuda")`` waits until the GPU has finished
        all the work queued so far, which would stall the training loop at every batch. (Towards the CPU
        it must block: the values are read right after.)"""
        device = torch.device(device)
        non_blocking = device.type != "cpu"
        move = lambda t: None if t is None else t.to(device, non_blocking=non_blocking)  # noqa: E731
        return MixParams(move(self.lam), move(self.perm), move(self.boxes), move(self.lam_drawn))


def _check_alpha(alpha: Any, name: str) -> float:
    """``alpha`` as a float; one clear line when it cannot parametrise Beta(alpha, alpha)."""
    message = (f"{name} alpha must be > 0 and finite, got {alpha!r}; "
               f"to disable {name} do not apply it (or pass None to MixCutMix)")
    if isinstance(alpha, (bool, str, bytes)):
        raise ValueError(message)
    try:
        value = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(message) from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(message)
    return value


def _check_batch_size(batch_size: Any) -> int:
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise ValueError(f"batch_size must be an integer, got {batch_size!r}")
    if batch_size < 1:
        raise ValueError(f"empty batch (batch_size={batch_size}): MixUp / CutMix need at least one image")
    return batch_size


def sample_beta(alpha: float, n: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """``n`` draws of Beta(alpha, alpha) as float64 on the CPU, reproducible with ``generator``.

    Beta(a, a) is ``G1 / (G1 + G2)`` with ``G1, G2 ~ Gamma(a)``. For small ``a`` the gamma draws
    underflow to 0 (``0 / 0``), so we work with logarithms: ``Gamma(a) = Gamma(a + 1) * U**(1/a)``
    (``U`` uniform) gives ``log G = log Gamma(a + 1) + log(U) / a`` without underflow, and
    ``lam = sigmoid(log G1 - log G2)``.
    """
    alpha = _check_alpha(alpha, "MixUp/CutMix")
    shape = torch.full((2, n), alpha + 1.0, dtype=torch.float64)
    # torch._standard_gamma is the sampler behind torch.distributions.Gamma; unlike the distribution
    # class it accepts a generator (available for years, unchanged in torch 2.11 .. 2.13).
    gamma = torch._standard_gamma(shape, generator=generator)
    uniform = torch.rand((2, n), dtype=torch.float64, generator=generator)
    log_g = gamma.log() + uniform.log() / alpha
    return torch.sigmoid(log_g[0] - log_g[1])


def random_partners(batch_size: int, *, generator: torch.Generator | None = None) -> torch.Tensor:
    """A random permutation made of a single cycle: ``perm[i] != i`` whenever ``batch_size > 1``.

    Shuffle the batch order, then pair each sample with the one before it *in that order* (torchvision's
    ``roll(1, 0)``, applied to a shuffled order)."""
    order = torch.randperm(batch_size, generator=generator)
    perm = torch.empty_like(order)
    perm[order] = order.roll(1)
    return perm


def cutmix_boxes(lam: torch.Tensor, cy: torch.Tensor, cx: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Boxes ``[n, 4]`` ``(y0, y1, x0, x1)`` (half-open, clipped) of side ratio ``sqrt(1 - lam)`` centred at (cy, cx).

    Height ``floor(H * sqrt(1 - lam))`` (truncation), width likewise; rows ``[cy - h//2, cy - h//2 + h)``.
    """
    ratio = torch.sqrt(1.0 - lam.to(torch.float64))
    h = torch.floor(height * ratio).long()
    w = torch.floor(width * ratio).long()
    y0, x0 = cy - h // 2, cx - w // 2
    return torch.stack([y0.clamp(0, height), (y0 + h).clamp(0, height),
                        x0.clamp(0, width), (x0 + w).clamp(0, width)], dim=1)


def box_label_weight(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """The CutMix label weight of each box: ``1 - area / (H * W)``, as float64 ``[B]``."""
    area = (boxes[:, 1] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 2])
    return 1.0 - area.to(torch.float64) / (height * width)


def cutmix_params(boxes: torch.Tensor, perm: torch.Tensor, height: int, width: int) -> MixParams:
    """CutMix params from given boxes (``[B, 4]``, ``(y0, y1, x0, x1)``): the label weights are computed from
    the boxes' areas, so pixels and labels always agree. Useful to reproduce someone else's boxes."""
    boxes = torch.as_tensor(boxes, dtype=torch.long)
    return MixParams(lam=box_label_weight(boxes, height, width), perm=torch.as_tensor(perm).long(), boxes=boxes)


def sample_mix_params(batch_size: int, alpha: float, *, kind: str = "mixup", height: int | None = None,
                      width: int | None = None, per_sample: bool = True, generator: torch.Generator | None = None,
                      device: torch.device | str = "cpu") -> MixParams:
    """Draw the partners, the ``lam`` and (CutMix) the boxes for one batch.

    Draws happen on the CPU, in this order: partners, ``lam``, box centres (rows then columns), using
    ``generator`` (a CPU ``torch.Generator``; ``None``: the global RNG, seeded by ``torch.manual_seed``).
    The same seeded generator gives the same params. ``per_sample=False`` draws one ``lam`` (and one box)
    for the whole batch, as torchvision does. CutMix needs ``height`` and ``width``.
    """
    batch_size = _check_batch_size(batch_size)
    name = {"mixup": "MixUp", "cutmix": "CutMix"}.get(kind)
    if name is None:
        raise ValueError(f"kind must be 'mixup' or 'cutmix', got {kind!r}")
    alpha = _check_alpha(alpha, name)
    if generator is not None and generator.device.type != "cpu":
        raise ValueError("generator must be a CPU torch.Generator: the draws are made on the CPU, then moved")
    if kind == "cutmix":
        for dim_name, size in (("height", height), ("width", width)):
            if isinstance(size, bool) or not isinstance(size, int) or size < 1:
                raise ValueError(f"CutMix needs the image {dim_name} as a positive integer, got {size!r}")
    perm = random_partners(batch_size, generator=generator)
    n = batch_size if per_sample else 1
    lam_drawn = sample_beta(alpha, n, generator=generator)
    boxes = None
    if kind == "mixup":
        lam = lam_drawn.clone()
    else:
        cy = torch.randint(height, (n,), generator=generator)
        cx = torch.randint(width, (n,), generator=generator)
        boxes = cutmix_boxes(lam_drawn, cy, cx, height, width)
        lam = box_label_weight(boxes, height, width)
    if not per_sample:  # one draw shared by the whole batch
        lam, lam_drawn = lam.expand(batch_size).clone(), lam_drawn.expand(batch_size).clone()
        boxes = None if boxes is None else boxes.expand(batch_size, 4).clone()
    return MixParams(lam=lam, perm=perm, boxes=boxes, lam_drawn=lam_drawn).to(device)


# --------------------------------------------------------------------------------------------------
# Shared checks and helpers
# --------------------------------------------------------------------------------------------------

def _check_inputs(images: torch.Tensor, targets: torch.Tensor, params: MixParams, kind: str) -> None:
    if images.ndim != 4:
        raise ValueError(f"images must be a batch [B, C, H, W], got shape {tuple(images.shape)}")
    if images.shape[0] == 0:
        raise ValueError("empty batch: MixUp / CutMix need at least one image")
    if kind == "mixup" and not images.dtype.is_floating_point:
        raise ValueError(f"MixUp needs floating point images, got {images.dtype}: convert them first "
                         "(e.g. torchvision.transforms.v2.ToDtype(torch.float32, scale=True))")
    if len(targets) != len(images) or len(params) != len(images):
        raise ValueError(f"batch sizes differ: {len(images)} images, {len(targets)} targets, {len(params)} params")
    if kind == "cutmix" and params.boxes is None:
        raise ValueError("CutMix needs params with boxes: sample_mix_params(..., kind='cutmix', height=H, width=W)")


def _memory_format(images: torch.Tensor) -> torch.memory_format:
    """channels_last when the input is (unambiguously) channels_last, else contiguous NCHW."""
    if images.is_contiguous(memory_format=torch.channels_last) and not images.is_contiguous():
        return torch.channels_last
    return torch.contiguous_format


def _finish(mixed: torch.Tensor, images: torch.Tensor, inplace: bool) -> torch.Tensor:
    """Write the result into ``images`` (``inplace``) or return it with the input's dtype and memory format
    (no copy when ``mixed`` already has them)."""
    if inplace:
        return images.copy_(mixed)
    return mixed.to(images.dtype).contiguous(memory_format=_memory_format(images))


def _partners(images: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """``images[perm]`` (a fresh tensor) in the memory format of ``images``.

    ``index_select`` returns a contiguous NCHW tensor whatever its input's layout; from a channels_last
    batch, the element-wise operations after it would then produce NCHW too, and :func:`_finish` would pay
    one more pass over the batch to convert back. Selecting along dimension 0 of the NHWC view keeps the
    layout for free (``x[perm]`` keeps it as well, through the slower general indexing path)."""
    if _memory_format(images) is torch.channels_last:
        return images.permute(0, 2, 3, 1).index_select(0, perm).permute(0, 3, 1, 2)
    return images.index_select(0, perm)


def mix_weights(lam: torch.Tensor, dtype: torch.dtype, device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lam, 1 - lam)`` as ``dtype`` on ``device``: the weights of the own sample and of the partner.

    ``1 - lam`` is computed in float64 and then rounded, like torchvision's ``1.0 - lam`` on a Python
    float; computing it after rounding ``lam`` to float32 can differ in the last bit."""
    lam = lam.to(device=device, dtype=torch.float64)
    return lam.to(dtype), (1.0 - lam).to(dtype)


def _weight_pairs(lam: torch.Tensor, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``[B, 2]``: column 0 is ``lam``, column 1 is ``1 - lam``, the same values as :func:`mix_weights` in one
    tensor, which MixUp shares between the images and the labels (three small operations saved)."""
    lam = lam.to(device=device, dtype=torch.float64)
    return torch.stack([lam, 1.0 - lam], dim=1).to(dtype)


def _mix_targets(targets: torch.Tensor, params: MixParams, num_classes: int | None,
                 weights: torch.Tensor | None = None) -> torch.Tensor:
    """``lam_i * t_i + (1 - lam_i) * t_perm[i]`` for the whole batch: float32 for integer labels, else the
    targets' dtype. ``weights``: :func:`_weight_pairs` already computed (used when dtype and device match).

    Integer labels are not one-hot encoded first: the two weights of each sample are added at its two
    classes, ``zeros([B, K]).scatter_add_(1, [y_i, y_perm[i]], [lam_i, 1 - lam_i])``. Same values as the
    one-hot formula bit for bit: every other class gets 0, a class gets ``0 + lam_i`` or ``0 + (1 - lam_i)``
    (exact), and when both labels are the same class it gets ``lam_i + (1 - lam_i)``, one rounding either
    way and in either order. Four small operations (gather the partners' labels, pair, zeros, scatter) instead
    of seven (one-hot as zeros and scatter, cast, gather, two products, a sum). On a CPU there is also no
    range check of the labels that reads them (``F.one_hot``'s): an out-of-range label is an error from
    ``scatter_add_`` instead (on a GPU, a device-side assertion in both cases)."""
    labels = _is_label_vector(targets, num_classes)
    compute = torch.float32 if labels else _compute_dtype(targets.dtype)
    perm = params.perm.to(targets.device)
    if weights is None or weights.dtype != compute or weights.device != targets.device:
        weights = _weight_pairs(params.lam, compute, targets.device)
    if labels:
        classes = targets.long()
        pairs = torch.stack([classes, classes.index_select(0, perm)], dim=1)
        out = torch.zeros(len(targets), num_classes, dtype=compute, device=targets.device)
        return out.scatter_add_(1, pairs, weights)
    t = targets.to(compute)
    return (weights[:, :1] * t + weights[:, 1:] * t.index_select(0, perm)).to(targets.dtype)


# --------------------------------------------------------------------------------------------------
# The readable loops ("before")
# --------------------------------------------------------------------------------------------------

def mixup_reference(images: torch.Tensor, targets: torch.Tensor, params: MixParams, *,
                    num_classes: int | None = None, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp, one image at a time: ``x_i' = lam_i x_i + (1 - lam_i) x_perm[i]``, same for the targets.

    Reads from an untouched copy of the batch: writing image ``i`` in place must not change the partner
    another image reads later. Returns ``(mixed_images, soft_targets)``.
    """
    _check_inputs(images, targets, params, "mixup")
    soft = to_soft_targets(targets, num_classes)
    source = images.clone() if inplace else images
    out = images if inplace else torch.empty_like(images)
    out_targets = torch.empty_like(soft)
    compute, t_compute = _compute_dtype(images.dtype), _compute_dtype(soft.dtype)
    w_own, w_other = mix_weights(params.lam, compute, images.device)
    t_own, t_other = mix_weights(params.lam, t_compute, soft.device)
    for i, j in enumerate(params.perm.tolist()):
        own, partner = source[i].to(compute), source[j].to(compute)
        out[i] = (w_own[i] * own + w_other[i] * partner).to(images.dtype)
        out_targets[i] = (t_own[i] * soft[i].to(t_compute) + t_other[i] * soft[j].to(t_compute)).to(soft.dtype)
    return out, out_targets


def cutmix_reference(images: torch.Tensor, targets: torch.Tensor, params: MixParams, *,
                     num_classes: int | None = None, inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix, one image at a time: copy image ``i``, paste the partner's pixels inside box ``i``; labels are
    mixed with the area-based weight ``params.lam``. Returns ``(mixed_images, soft_targets)``."""
    _check_inputs(images, targets, params, "cutmix")
    soft = to_soft_targets(targets, num_classes)
    source = images.clone() if inplace else images
    out = images if inplace else torch.empty_like(images)
    out_targets = torch.empty_like(soft)
    t_compute = _compute_dtype(soft.dtype)
    t_own, t_other = mix_weights(params.lam, t_compute, soft.device)
    for i, (j, (y0, y1, x0, x1)) in enumerate(zip(params.perm.tolist(), params.boxes.tolist())):
        out[i] = source[i]
        out[i, :, y0:y1, x0:x1] = source[j, :, y0:y1, x0:x1]
        out_targets[i] = (t_own[i] * soft[i].to(t_compute) + t_other[i] * soft[j].to(t_compute)).to(soft.dtype)
    return out, out_targets


# --------------------------------------------------------------------------------------------------
# The batched versions ("after")
# --------------------------------------------------------------------------------------------------

def mixup(images: torch.Tensor, targets: torch.Tensor, params: MixParams, *, num_classes: int | None = None,
          inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """MixUp on the whole batch at once: ``lam`` of shape ``[B, 1, 1, 1]`` broadcasts over C, H, W, and
    ``index_select(0, perm)`` gathers all partners in one operation.

    Same arithmetic as :func:`mixup_reference`, element by element, hence the same result. Computes in
    float32 (or float64) and rounds once to the input dtype; keeps the input's memory format.

    The gathered partners are a fresh tensor of our own, so we scale them in place (``mul_``, ``add_``)
    instead of allocating two more batch-sized temporaries: on a CPU, fresh large buffers cost page
    faults. (``x[perm]`` gives the same values as ``index_select`` but goes through the general
    advanced-indexing path, several times slower on CPU.) The weights ``(lam, 1 - lam)`` are computed once
    for the images and the labels when both are mixed in float32.
    """
    _check_inputs(images, targets, params, "mixup")
    x = images.to(_compute_dtype(images.dtype))
    weights = _weight_pairs(params.lam, x.dtype, images.device)
    own, other = weights[:, 0].view(-1, 1, 1, 1), weights[:, 1].view(-1, 1, 1, 1)
    partners = _partners(x, params.perm.to(images.device))
    mixed = partners.mul_(other).add_(own * x)  # (1 - lam) x_perm + lam x
    return _finish(mixed, images, inplace), _mix_targets(targets, params, num_classes, weights)


def cutmix_mask(boxes: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Boolean ``[B, 1, H, W]``, True inside each sample's box (rows ``[y0, y1)``, columns ``[x0, x1)``).

    Four operations whatever the batch size: one ``arange(max(H, W))`` compared with the four corners of every
    box at once (``past[b, k, i] = i >= boxes[b, k]``, shape ``[B, 4, L]``); a row is inside its box when it
    is past ``y0`` and not past ``y1`` (``past_y0 > past_y1`` on booleans, likewise for the columns); the
    outer AND of the rows ``[B, 1, H, 1]`` and the columns ``[B, 1, 1, W]`` gives the mask. The channel
    dimension broadcasts in :func:`cutmix`. (The direct ``(rows >= y0) & (rows < y1) & (cols >= x0) &
    (cols < x1)`` on ``[B, H, 1]`` and ``[B, 1, W]`` pieces gives the same mask with nine operations; on a GPU,
    with small images, each operation costs a launch of several microseconds, far more than its work.)"""
    index = torch.arange(max(height, width), device=boxes.device)
    past = index >= boxes.unsqueeze(-1)  # [B, 4, L]: past y0, past y1, past x0, past x1
    inside = past[:, 0::2] > past[:, 1::2]  # [B, 2, L]: rows in [y0, y1), columns in [x0, x1)
    return inside[:, 0, None, :height, None] & inside[:, 1, None, None, :width]


def cutmix(images: torch.Tensor, targets: torch.Tensor, params: MixParams, *, num_classes: int | None = None,
           inplace: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """CutMix on the whole batch at once: one mask for all boxes (:func:`cutmix_mask`), then
    ``torch.where(mask, partners, images)``. Pixels are copied, never computed: any dtype is exact.

    Two passes over the images (gather the partners, select), in their own memory format; no host-device
    synchronisation; the labels are mixed with ``params.lam``, computed from the clipped boxes' areas when
    the params were made. In place, the select writes straight into ``images`` (it reads each pixel before
    writing it, and the partners were gathered before)."""
    _check_inputs(images, targets, params, "cutmix")
    mask = cutmix_mask(params.boxes.to(images.device), images.shape[-2], images.shape[-1])
    partners = _partners(images, params.perm.to(images.device))
    if inplace:
        mixed = torch.where(mask, partners, images, out=images)
    else:
        mixed = _finish(torch.where(mask, partners, images), images, inplace=False)
    return mixed, _mix_targets(targets, params, num_classes)


class MixCutMix:
    """Per batch, CutMix with probability ``switch_prob``, else MixUp (timm's recipe), per-sample ``lam``.

    ``mixup_alpha`` or ``cutmix_alpha`` may be ``None`` to use only the other one. Call it on a batch
    already on its device, e.g. in the training loop right before the forward pass::

        mix = MixCutMix(num_classes=10)
        images, soft = mix(images, labels)
        loss = soft_cross_entropy(model(images), soft)

    ``last_params`` keeps the params of the last call (to look at or to replay).
    """

    def __init__(self, num_classes: int, mixup_alpha: float | None = 0.2, cutmix_alpha: float | None = 1.0,
                 switch_prob: float = 0.5, per_sample: bool = True, generator: torch.Generator | None = None) -> None:
        if mixup_alpha is None and cutmix_alpha is None:
            raise ValueError("MixCutMix needs mixup_alpha or cutmix_alpha (both are None): "
                             "to train without mixing, do not apply it")
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
        if not 0.0 <= float(switch_prob) <= 1.0:
            raise ValueError(f"switch_prob (probability of CutMix) must be in [0, 1], got {switch_prob!r}")
        self.num_classes = num_classes
        self.mixup_alpha = None if mixup_alpha is None else _check_alpha(mixup_alpha, "MixUp")
        self.cutmix_alpha = None if cutmix_alpha is None else _check_alpha(cutmix_alpha, "CutMix")
        self.switch_prob = float(switch_prob)
        self.per_sample = per_sample
        self.generator = generator
        self.last_params: MixParams | None = None

    def _pick_kind(self) -> str:
        if self.mixup_alpha is None:
            return "cutmix"
        if self.cutmix_alpha is None:
            return "mixup"
        return "cutmix" if float(torch.rand((), generator=self.generator)) < self.switch_prob else "mixup"

    def __call__(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if images.ndim != 4:
            raise ValueError(f"images must be a batch [B, C, H, W], got shape {tuple(images.shape)}")
        kind = self._pick_kind()
        alpha = self.cutmix_alpha if kind == "cutmix" else self.mixup_alpha
        params = sample_mix_params(len(images), alpha, kind=kind, height=images.shape[-2], width=images.shape[-1],
                                   per_sample=self.per_sample, generator=self.generator, device=images.device)
        self.last_params = params
        apply = cutmix if kind == "cutmix" else mixup
        return apply(images, labels, params, num_classes=self.num_classes)

    def state_dict(self) -> dict:
        """The generator's state (when it has its own): a checkpoint keeps it, so that a resumed run draws the
        same mixes as one never stopped. Without a generator, MixCutMix draws from torch's global generator,
        which the checkpoint keeps anyway."""
        return {"generator": self.generator.get_state()} if self.generator is not None else {}

    def load_state_dict(self, state: dict) -> None:
        if self.generator is not None and "generator" in state:
            self.generator.set_state(state["generator"])
        elif self.generator is not None:
            raise ValueError("this checkpoint has no MixCutMix generator state: resume with the options of the run "
                             "that wrote it")

    def __repr__(self) -> str:
        return (f"MixCutMix(num_classes={self.num_classes}, mixup_alpha={self.mixup_alpha}, "
                f"cutmix_alpha={self.cutmix_alpha}, switch_prob={self.switch_prob}, per_sample={self.per_sample})")
