"""Goals and hints of Jour 2 (augment, dataloader, ddp, dp_scratch): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour2
    ("dataloader", "wait"): _h(
        "Measure how long the training loop waits for the data loader: the first batch, then each next one.",
        "The first batch includes starting the workers; later waits show whether the loader keeps up.",
        "time.perf_counter() around iter(loader) and each next(...).",
        shape="Start a clock, start the iteration and take the first batch: that duration is the first wait. Then, "
              "for each of the remaining batches asked for, restart the clock just before taking it and keep the "
              "time it took; one single iteration for the whole measurement. Return the first wait and the list of "
              "the others."),
    ("dataloader", "budget"): _h(
        "Split a node's CPU cores between the ranks' data-loading workers, keeping one core per rank for its "
        "training loop.",
        "Each rank's main process needs a core; the rest are shared evenly among the ranks' workers.",
        "Integer division of the remaining cores by the number of ranks per node, never below 0.",
        shape="From the node's cores, set aside one per rank (each runs its training loop), share what is left "
              "evenly between the ranks, rounding down, and never go below zero."),
    ("augment", "box"): _h(
        "Draw the CutMix box: a rectangle whose area is the given fraction of the image, clipped at the borders.",
        "A rectangle whose sides both shrink by the same ratio keeps the image's proportions, and its area shrinks "
        "by the square of that ratio. The box is centred on a random pixel, so near a border part of it falls "
        "outside: that part is simply lost.",
        "math.sqrt, math.floor (or int() on non-negative numbers), min and max; return four Python ints.",
        shape="The fraction of the area kept by the image gives the fraction pasted; its square root is the ratio "
              "of each side; each side is the image's side in that direction times the ratio, truncated to whole "
              "pixels; the box is centred on the given pixel; each corner is then clipped to the image (the box "
              "loses what is outside, it is not moved)."),
    ("augment", "mixup"): _h(
        "Mix each image of a batch with another image of the same batch (MixUp), in one batched operation.",
        "The permutation you are given pairs every image with a partner; each image's own weight lam mixes both "
        "its pixels and its (one-hot or soft) targets.",
        "Tensor.view or indexing with None to add axes of size 1 (broadcasting), Tensor.to(dtype), indexing a batch "
        "with a tensor of indices; torch.lerp is an alternative to the two products.",
        shape="Each image's weight is shaped so that it multiplies every pixel of that image (and every class of "
              "its label); each image is its weight times itself plus the rest times its partner (the one the "
              "permutation names); the labels the same way; new tensors, in the images' own dtype."),
    ("augment", "cutmix_batch"): _h(
        "Apply CutMix to a whole batch at once: each image gets its own box filled with its partner's pixels, and "
        "its label gives the partner exactly the fraction of the image that was pasted.",
        "One boolean mask for all the boxes replaces the per-image loop: comparisons of every row and column index "
        "with every image's bounds, broadcast over the batch, cost the same number of operations for 8 images or "
        "512. A box clipped at a border pastes less than drawn, so the label weight comes from what was really "
        "pasted.",
        "torch.sqrt, torch.floor, Tensor.clamp, torch.arange, comparison operators and & on broadcast shapes, "
        "torch.where (it returns a new tensor), indexing with a permutation.",
        shape="All boxes at once: the sides from the drawn values, the corners centred then clipped, as in the "
              "first exercise but for the whole batch. Then one mask for the batch: a pixel is in an image's box "
              "when its row and its column both fall inside that image's half-open ranges, compared for every image"
              " together by broadcasting. Inside the mask the image shows its partner's pixels, outside its own. "
              "The fraction pasted is the clipped box's area over the image's; the label keeps the rest of itself "
              "and takes that fraction of the partner's label."),
    ("augment", "accuracy"): _h(
        "Measure accuracy when labels may be soft (MixUp/CutMix): a prediction scores the weight its class has in "
        "the label.",
        "With one-hot labels this is the usual accuracy; with mixed labels a prediction earns partial credit.",
        "Tensor.argmax(dim=...), Tensor.gather (or indexing with two index tensors), Tensor.float(), Tensor.mean(), "
        "Tensor.item().",
        shape="Take each image's predicted class; with integer labels compare it with the label; with label weights"
              " read the weight the label gives to that class. Average over the images and return a plain number."),
    # Jour2 DDP script
    ("ddp", "device"): _h(
        "Choose the device of this process: one GPU per process on a node, the CPU when there is no GPU.",
        "Ranks are numbered across all nodes, but each node numbers its GPUs from 0.",
        "torch.cuda.is_available(), ctx.local_rank (not ctx.rank), torch.device(...).",
        shape="When GPUs exist, the device is the GPU numbered by the process's position on its own node; otherwise"
              " the CPU."),
    ("ddp", "wrap"): _h(
        "Prepare the model for data-parallel training: on the right device, wrapped for gradient synchronisation "
        "only when there are several processes, with the options you are given.",
        "DDP needs a process group; a single process trains the plain model. Synchronised BatchNorm is optional "
        "and must be converted before wrapping.",
        "nn.SyncBatchNorm.convert_sync_batchnorm, DistributedDataParallel(..., device_ids=None on the CPU, "
        "bucket_cap_mb=..., find_unused_parameters=...).",
        shape="First the optional BatchNorm conversion, then the move to the device; with one process stop there; "
              "with several wrap the model, telling the wrapper which device it lives on only when that device is a"
              " GPU, and passing on the two options you were given."),
    ("ddp", "shard"): _h(
        "Give each rank its own, disjoint part of the dataset, with the global batch split evenly between ranks.",
        "Every rank must shuffle with the same seed so the shards do not overlap; the per-rank batch is the global "
        "one divided by the world size, which must divide it.",
        "torch.utils.data.DistributedSampler(num_replicas=..., rank=..., shuffle=True, seed=...), per_rank_batch, "
        "and the DataLoader's sampler= argument.",
        shape="Check that the global batch splits evenly over the ranks and compute each rank's share; build one "
              "sampler that knows how many ranks there are and which one this is, shuffles with the seed shared by "
              "all ranks, and drops the uneven tail; build the loader on that sampler with the per-rank batch; "
              "return both."),
    ("ddp", "epoch"): _h(
        "Give each epoch its own shuffle, identical on every rank.",
        "A DistributedSampler derives its order from the seed and an epoch number that you must tell it.",
        "The sampler's set_epoch method, once, before iterating over the loader.",
        shape="Before the loop over the batches starts, tell the sampler which epoch this is, once; the rest of the"
              " epoch is unchanged."),
    ("ddp", "reduce"): _h(
        "Turn each rank's sums (loss, correct answers, images) into global mean loss and accuracy, the same on "
        "every rank.",
        "Sum the raw totals over the ranks, then divide: averaging the ranks' means is wrong when shards differ in "
        "size. One collective for all three numbers is cheaper than three.",
        "torch.stack into one float64 tensor, torch.distributed.all_reduce (op SUM) when a process group exists.",
        shape="Put the three local totals in one tensor of a wide float type; when a process group exists, sum that"
              " tensor over the ranks in place; read the sums back from that same tensor and divide the loss and "
              "the correct answers by the number of images."),
    ("ddp", "checkpoint"): _h(
        "Save a checkpoint from one process only, loadable into a plain model, and make every process wait until "
        "it is written.",
        "All ranks hold the same weights: one writer is enough. A barrier only works if every rank reaches it, "
        "after the file exists.",
        "dlo.training.save_checkpoint (unwraps DDP) when ctx.is_main, then torch.distributed.barrier() on every "
        "rank when a process group exists.",
        shape="Only the main rank writes the file, from the unwrapped model; then every rank, the writer included, "
              "waits at one barrier (when a process group exists); the writer returns the path, the others nothing."),
    # Jour2 data parallelism by hand
    ("dp_scratch", "naive"): _h(
        "After the backward pass, make every rank's gradients the average of all ranks' gradients, so that "
        "one optimizer step equals a step on the whole global batch.",
        "Each rank's loss is a mean over its own slice, so the mean of the ranks' gradients is the gradient "
        "of the mean loss over the global batch. Every rank must end with the same numbers, in the tensors "
        "the optimizer reads.",
        "model.parameters(), torch.distributed.all_reduce (in place, ReduceOp.SUM), "
        "torch.distributed.get_world_size(), Tensor.div_.",
        shape="For each parameter that has a gradient (a frozen one has none): combine that gradient across the "
              "ranks so that each rank receives the total, in the same tensor, then turn the total into a mean. "
              "Nothing is copied out and forgotten; nothing is divided twice."),
    ("dp_scratch", "broadcast"): _h(
        "Before training, make every rank's model an exact copy of rank 0's: its weights and its other state.",
        "Averaged gradients keep identical copies identical but never bring different copies together. The "
        "state is more than the trained weights: frozen parameters and buffers (BatchNorm's running "
        "statistics and its integer counter) too.",
        "torch.distributed.broadcast(tensor, src=0) (in place; with async_op=True, the handle's wait()), "
        "model.parameters(), model.buffers(), torch.no_grad(), Tensor.copy_.",
        shape="For every parameter and every buffer, on every rank, the same calls in the same order: rank 0 sends,"
              " the others receive, and what is received ends up in the model's own tensor before the function "
              "returns."),
    ("dp_scratch", "overlap"): _h(
        "Start averaging each gradient the moment it is ready, while the backward pass computes the earlier "
        "layers, and make sure every average has arrived before the optimizer step.",
        "Backward produces the last layers' gradients first. Communication started early and left running in "
        "the background is hidden behind the rest of backward; communication that backward has to wait for is"
        " not.",
        "Tensor.register_post_accumulate_grad_hook (returns a handle with remove()), "
        "torch.distributed.all_reduce(..., async_op=True) (returns a torch.distributed.Work: its wait()), "
        "Tensor.div_, list.clear().",
        shape="At construction, ask autograd to call you back once each trained parameter's gradient is complete. "
              "In that callback, start the gradient's averaging without waiting for it and keep what lets you wait "
              "later. In finish(), after backward, wait for everything started, turn sums into means, and forget "
              "what you kept."),
    ("dp_scratch", "buckets"): _h(
        "Send fewer, larger messages: group the gradients into flat buckets of a given size, in the order "
        "backward produces them, and average each bucket as soon as it holds all its gradients.",
        "Each message pays a fixed latency, so many small all-reduces are slow; a bucket that waits for a "
        "size threshold must still be sent when it is the last, smaller one. Sizes are in bytes, and not "
        "every gradient has 4-byte elements.",
        "Tensor.numel(), Tensor.element_size(), reversed(range(...)); Tensor.reshape(-1), Tensor.copy_ into a"
        " slice of a flat buffer, torch.distributed.all_reduce(..., async_op=True), Work.wait(), "
        "Tensor.view_as.",
        shape="The plan: walk the parameters from the last to the first, adding each one's size in bytes to the "
              "open bucket and closing it once it reaches the threshold; what remains is a bucket too. The sync: "
              "each callback copies its gradient into its place in its bucket and counts it; a bucket whose count "
              "is complete is sent without waiting. finish() waits for every bucket, turns sums into means, copies "
              "each slice back to its gradient and resets the counts."),
    ("dp_scratch", "no_sync"): _h(
        "Accumulate gradients over k micro-batches and communicate only once, after the last one, so that the"
        " step equals one step on the k micro-batches together.",
        "Gradients add up over backward passes; each micro-batch's loss must be scaled so that the sum is a "
        "mean. Communication switched off must be switched back on even if the block fails, and DDP decides "
        "during the forward whether the following backward communicates. The optimizer must only see this "
        "step's averaged gradients.",
        "contextlib.contextmanager, try / finally around the yield; optimizer.zero_grad(), "
        "contextlib.nullcontext(), Tensor.backward(), sync.finish(), optimizer.step(), Tensor.detach().",
        shape="no_sync: switch communication off, hand control to the block, switch it back whatever happens. The "
              "step: clear the gradients once; all but the last micro-batch's forward and backward with "
              "communication off, the last one with it on; wait for the averages; one optimizer step; report the "
              "mean of the k losses."),
}
