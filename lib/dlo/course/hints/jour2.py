"""Goals and hints of Jour 2 (augment, dataloader, ddp, dp_scratch): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour2
    ("dataloader", "wait"): _h(
        "Measure how long the training loop waits for the data loader: the first batch, then each next one.",
        "The first batch includes starting the workers; later waits show whether the loader keeps up.",
        "time.perf_counter() around iter(loader) and each next(...)."),
    ("dataloader", "budget"): _h(
        "Split a node's CPU cores between the ranks' data-loading workers, keeping one core per rank for its "
        "training loop.",
        "Each rank's main process needs a core; the rest are shared evenly among the ranks' workers.",
        "Integer division of the remaining cores by the number of ranks per node, never below 0."),
    ("augment", "box"): _h(
        "Draw the CutMix box: a rectangle whose area is the given fraction of the image, clipped at the borders.",
        "The box covers a fraction 1 - lam of the area, so each side is the image's side times sqrt(1 - lam); it is "
        "centred on the given point and clipped at the borders.",
        "math.sqrt, math.floor; the corners (y0, y1, x0, x1) clamped between 0 and the image size."),
    ("augment", "mixup"): _h(
        "Mix each image of a batch with another image of the same batch (MixUp), in one batched operation.",
        "The permutation you are given pairs every image with a partner; each image's own weight lam mixes both "
        "its pixels and its (one-hot or soft) targets.",
        "lam reshaped to broadcast (view(-1, 1, 1, 1) for images, view(-1, 1) for targets), images[perm]; no in-place "
        "operations on the inputs."),
    ("augment", "cutmix_batch"): _h(
        "Apply CutMix to a whole batch at once: each image gets its own box filled with its partner's pixels, and "
        "its label gives the partner exactly the fraction of the image that was pasted.",
        "One boolean mask for all the boxes replaces the per-image loop: a pixel is inside box i when its row is in "
        "[y0_i, y1_i) and its column in [x0_i, x1_i). A box clipped at a border pastes less than drawn, so the "
        "label weight comes from the clipped box's area.",
        "torch.floor, clamp, torch.arange(H).view(1, H, 1) compared with y0.view(-1, 1, 1) (broadcasting), "
        "torch.where(mask[:, None], images[perm], images); weight area / (H * W) for targets[perm]."),
    ("augment", "accuracy"): _h(
        "Measure accuracy when labels may be soft (MixUp/CutMix): a prediction scores the weight its class has in "
        "the label.",
        "With one-hot labels this is the usual accuracy; with mixed labels a prediction earns partial credit.",
        "argmax of the logits, then gather that class's weight in the (soft) labels, averaged."),
    # Jour2 DDP script
    ("ddp", "device"): _h(
        "Choose the device of this process: one GPU per process on a node, the CPU when there is no GPU.",
        "Ranks are numbered across all nodes, but each node numbers its GPUs from 0.",
        "torch.cuda.is_available(), ctx.local_rank (not ctx.rank), torch.device(...)."),
    ("ddp", "wrap"): _h(
        "Prepare the model for data-parallel training: on the right device, wrapped for gradient synchronisation "
        "only when there are several processes, with the options you are given.",
        "DDP needs a process group; a single process trains the plain model. Synchronised BatchNorm is optional "
        "and must be converted before wrapping.",
        "nn.SyncBatchNorm.convert_sync_batchnorm, DistributedDataParallel(..., device_ids=None on the CPU, "
        "bucket_cap_mb=..., find_unused_parameters=...)."),
    ("ddp", "shard"): _h(
        "Give each rank its own, disjoint part of the dataset, with the global batch split evenly between ranks.",
        "Every rank must shuffle with the same seed so the shards do not overlap; the per-rank batch is the global "
        "one divided by the world size, which must divide it.",
        "torch.utils.data.DistributedSampler(num_replicas=..., rank=..., shuffle=True, seed=...), per_rank_batch, "
        "and the DataLoader's sampler= argument."),
    ("ddp", "epoch"): _h(
        "Give each epoch its own shuffle, identical on every rank.",
        "A DistributedSampler derives its order from the seed and an epoch number that you must tell it.",
        "The sampler's set_epoch method, once, before iterating over the loader."),
    ("ddp", "reduce"): _h(
        "Turn each rank's sums (loss, correct answers, images) into global mean loss and accuracy, the same on "
        "every rank.",
        "Sum the raw totals over the ranks, then divide: averaging the ranks' means is wrong when shards differ in "
        "size. One collective for all three numbers is cheaper than three.",
        "torch.stack into one float64 tensor, torch.distributed.all_reduce (op SUM) when a process group exists."),
    ("ddp", "checkpoint"): _h(
        "Save a checkpoint from one process only, loadable into a plain model, and make every process wait until "
        "it is written.",
        "All ranks hold the same weights: one writer is enough. A barrier only works if every rank reaches it, "
        "after the file exists.",
        "dlo.training.save_checkpoint (unwraps DDP) when ctx.is_main, then torch.distributed.barrier() on every "
        "rank when a process group exists."),
    # Jour2 data parallelism by hand
    ("dp_scratch", "naive"): _h(
        "After the backward pass, make every rank's gradients the average of all ranks' gradients, so that one "
        "optimizer step equals a step on the whole global batch.",
        "Each rank's loss is a mean over its own slice, so the mean of the ranks' gradients is the gradient of the "
        "mean loss over the global batch. Every rank must end with the same numbers, in the tensors the optimizer "
        "reads.",
        "For each parameter that has a gradient (a frozen one has none): combine that gradient across the ranks so "
        "that each rank receives the total, in the same tensor, then turn the total into a mean. Nothing is "
        "copied out and forgotten; nothing is divided twice."),
    ("dp_scratch", "broadcast"): _h(
        "Before training, make every rank's model an exact copy of rank 0's: its weights and its other state.",
        "Averaged gradients keep identical copies identical but never bring different copies together. The state "
        "is more than the trained weights: frozen parameters and buffers (BatchNorm's running statistics and its "
        "integer counter) too.",
        "For every parameter and every buffer, on every rank, the same calls in the same order: rank 0 sends, the "
        "others receive, and what is received ends up in the model's own tensor before the function returns."),
    ("dp_scratch", "overlap"): _h(
        "Start averaging each gradient the moment it is ready, while the backward pass computes the earlier layers, "
        "and make sure every average has arrived before the optimizer step.",
        "Backward produces the last layers' gradients first. Communication started early and left running in the "
        "background is hidden behind the rest of backward; communication that backward has to wait for is not.",
        "At construction, ask autograd to call you back once each trained parameter's gradient is complete. In that "
        "callback, start the gradient's averaging without waiting for it and keep what lets you wait later. In "
        "finish(), after backward, wait for everything started, turn sums into means, and forget what you kept."),
    ("dp_scratch", "buckets"): _h(
        "Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order backward "
        "produces them, and average each bucket as soon as it holds all its gradients.",
        "Each message pays a fixed latency, so many small all-reduces are slow; a bucket that waits for a size "
        "threshold must still be sent when it is the last, smaller one. Sizes are in bytes, and not every "
        "gradient has 4-byte elements.",
        "The plan: walk the parameters from the last to the first, adding each one's size in bytes to the open "
        "bucket and closing it once it reaches the threshold; what remains is a bucket too. The sync: each "
        "callback copies its gradient into its place in its bucket and counts it; a bucket whose count is complete "
        "is sent without waiting. finish() waits for every bucket, turns sums into means, copies each slice back "
        "to its gradient and resets the counts."),
    ("dp_scratch", "no_sync"): _h(
        "Accumulate gradients over k micro-batches and communicate only once, after the last one, so that the step "
        "equals one step on the k micro-batches together.",
        "Gradients add up over backward passes; each micro-batch's loss must be scaled so that the sum is a mean. "
        "Communication switched off must be switched back on even if the block fails, and DDP decides during the "
        "forward whether the following backward communicates. The optimizer must only see this step's averaged "
        "gradients.",
        "no_sync: switch communication off, hand control to the block, switch it back whatever happens. The step: "
        "clear the gradients once; all but the last micro-batch's forward and backward with communication off, the "
        "last one with it on; wait for the averages; one optimizer step; report the mean of the k losses."),
}
