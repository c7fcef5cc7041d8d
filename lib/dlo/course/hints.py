"""What each exercise step asks for, and hints in three levels, in one place.

Every step (``course``, ``step``, as in ``dlo check --list``) has a *goal*: one or two sentences saying what
the code must achieve and why, with no code. The student copies use it for the ``TODO`` comment and the
``NotImplementedError`` message. ``dlo hint COURSE STEP`` then gives, one more each time it is called:

1. the concept (what to think about),
2. the tools (which functions, classes or arguments to use),
3. near-code: the outline written next to the solution in the source notebook or script
   (its ``# BEGIN SOLUTION: ...`` line), read from there so that it never drifts from the solution.

``dlo solution COURSE STEP`` prints the reference solution itself.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

from dlo.runtime.paths import RUNS_DIR


class Hint(NamedTuple):
    goal: str
    concept: str
    tools: str


def _h(goal: str, concept: str, tools: str) -> Hint:
    return Hint(goal, concept, tools)


HINTS: dict[tuple[str, str], Hint] = {
    # ---------------------------------------------------------------- Jour1
    ("jour1", "device"): _h(
        "Move a batch (images and labels) to the training device, so that the copy can overlap the GPU's work.",
        "A host-to-device copy from pinned memory can run asynchronously: the CPU queues it and goes on.",
        "Tensor.to(device, non_blocking=...) on each of the two tensors; return them as a pair."),
    ("jour1", "amp"): _h(
        "Run one training step with the forward pass in reduced precision (the dtype you are given), keeping the "
        "weights, the gradients and the update in fp32.",
        "Autocast changes the dtype of the operations run inside it, not the parameters; only the forward (and "
        "the loss) belongs inside it.",
        "torch.autocast(device_type=..., dtype=...) as a context manager around the forward and the loss."),
    ("jour1", "fp16"): _h(
        "Finish an fp16 training step so that small gradients do not underflow to zero, and the update keeps its "
        "true size.",
        "fp16 cannot represent very small gradients: multiply the loss by a large factor before the backward, "
        "divide the gradients by it before the update, and skip steps whose gradients overflowed.",
        "torch.amp.GradScaler: its scale(...) method on the loss (the backward goes through what it returns), "
        "then its step(optimizer) and update() methods."),
    ("jour1", "fp16_clip"): _h(
        "Write an fp16 training step whose gradients are clipped to a total norm of max_norm in their true units "
        "(not in the loss scale's), and whose update is still skipped when they overflow.",
        "After a scaled backward the gradients are the true ones times the scale: their norm must be measured "
        "after dividing them back, once, and the scaler must know they are already divided so that its step "
        "neither divides them again nor forgets to skip an overflowed step.",
        "The scaler's scale(...) for the backward, its unscale_(optimizer) method, "
        "torch.nn.utils.clip_grad_norm_ on the model's parameters, then the scaler's step(optimizer) and update()."),
    ("jour1", "channels_last"): _h(
        "Store the model's weights and the images in NHWC memory layout, without changing their shapes or values, "
        "so that Tensor Cores read convolutions' inputs contiguously.",
        "The memory format is a layout (strides), not a shape: NCHW tensors can be stored channels-last.",
        "torch.channels_last as memory_format for the model's .to(...) and for the images' .contiguous(...)."),
    ("jour1", "cudnn"): _h(
        "Let cuDNN time its convolution algorithms for each input shape and keep the fastest one.",
        "cuDNN has several algorithms per convolution; an autotuner can try them on the first call of a shape.",
        "A flag in torch.backends.cudnn (not `enabled`, not `deterministic`)."),
    ("jour1", "compile"): _h(
        "Return a compiled version of the model you are given, so that its operations get fused into fewer kernels.",
        "Compilation is lazy: wrapping costs nothing, the first call traces and compiles.",
        "torch.compile, applied to the model itself (not a copy); return what it returns."),
    ("jour1", "batch_sweep"): _h(
        "Try growing batch sizes until one does not fit in memory, and report the largest that did, without hiding "
        "any other kind of error.",
        "Only an out-of-memory error means 'too big': any other exception is a bug that must stay visible. Stop at "
        "the first batch that does not fit.",
        "try/except on torch.OutOfMemoryError only (not RuntimeError, its parent), break out of the loop."),
    ("jour1", "profiler"): _h(
        "Profile a few training steps, skipping the first (slow) ones, and write a trace TensorBoard or Perfetto "
        "can open.",
        "The first steps pay for warm-up (allocations, autotuning, compilation): a schedule waits, warms up, then "
        "records only the active steps, and it only advances when told that a step ended.",
        "torch.profiler.profile(activities=..., schedule=torch.profiler.schedule(...), on_trace_ready="
        "torch.profiler.tensorboard_trace_handler(...)), and the profiler's step() method after each step."),
    ("jour1", "evaluate"): _h(
        "Compute a model's accuracy over batches as fast as possible: no autograd graph, BatchNorm with its running "
        "statistics, and an exact count even when batches differ in size.",
        "Evaluation needs neither gradients nor batch statistics; accuracy is correct predictions over all images, "
        "not a mean of batch means.",
        "model.eval(), torch.inference_mode(), argmax over the classes; return a Python float."),
    # ---------------------------------------------------------------- Jour1 shapes
    ("shapes", "intensity"): _h(
        "Compute the arithmetic intensity (FLOPs per byte moved) of a matrix product, to place it on the roofline.",
        "A (m x k) by (k x n) product does 2mnk FLOPs and, at best, reads both inputs and writes the output once.",
        "FLOPs / ((mk + kn + mn) * bytes per element)."),
    ("shapes", "roofline"): _h(
        "Give the FLOP/s a kernel can reach on a GPU, from its arithmetic intensity, the peak compute and the "
        "memory bandwidth.",
        "Below the knee the memory feeds too slowly (memory-bound); above it the compute units are the limit.",
        "min of the peak FLOP/s and intensity x bandwidth."),
    ("shapes", "padding"): _h(
        "Round a dimension up to the next multiple of k, so that matrix shapes suit the Tensor Cores.",
        "The smallest multiple of k that is at least n; n itself when it already is one.",
        "Integer ceiling division (-(-n // k)) times k; return an int."),
    # ---------------------------------------------------------------- Jour2
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
    # ---------------------------------------------------------------- Jour2 DDP script
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
    # ---------------------------------------------------------------- Jour2 data parallelism by hand
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
    # ---------------------------------------------------------------- Jour3
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
    # ---------------------------------------------------------------- Jour4
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
    # ---------------------------------------------------------------- FSDP
    ("fsdp", "ddp"): _h(
        "Build the DDP baseline: the model on its device, wrapped only when there are several processes.",
        "DDP replicates the whole model on every rank; it needs a process group.",
        "DistributedDataParallel(model, device_ids=... only on GPUs)."),
    ("fsdp", "fsdp"): _h(
        "Shard the model with FSDP2, one unit per decoder layer plus the root, passing every option you are given "
        "to each unit.",
        "Each unit is all-gathered before it runs and freed after: layers first, so that the root keeps only what "
        "no layer owns. Options given to only some units silently change the run (fp32 instead of bf16).",
        "torch.distributed.fsdp.fully_shard(module, mp_policy=..., offload_policy=..., reshard_after_forward=...)."),
    ("fsdp", "precision"): _h(
        "Choose the mixed-precision policy for a precision name: compute in bf16 but reduce gradients in fp32.",
        "Summing gradients over many ranks in bf16 loses precision; fp32 needs no policy; unknown names are errors.",
        "MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...), None, ValueError."),
    ("fsdp", "checkpointing"): _h(
        "Make every decoder layer recompute its activations in the backward instead of storing them.",
        "Each layer keeps only its input; the wrapper must replace the layer in the model.",
        "checkpoint_wrapper from torch.distributed.algorithms._checkpoint.checkpoint_wrapper; assign into "
        "model.model.layers[i]."),
    ("fsdp", "reshard"): _h(
        "Let the caller choose whether each layer frees its gathered weights after the forward.",
        "Freeing saves memory but costs a second all-gather in the backward; the choice must reach every layer.",
        "The reshard_after_forward argument of fully_shard, on every call."),
    ("fsdp", "offload"): _h(
        "Choose where the sharded state lives: on the GPU, or in CPU memory when asked on a GPU run.",
        "Offloading only makes sense from a GPU; page-locked memory makes the copies faster.",
        "OffloadPolicy(), CPUOffloadPolicy(pin_memory=...), ValueError on a CPU device."),
    ("fsdp", "compile"): _h(
        "Compile each decoder layer in place, leaving the root uncompiled so that FSDP can wrap it.",
        "Per-layer graphs keep FSDP's per-layer hooks outside the compiled code.",
        "nn.Module.compile() on each layer (it compiles in place)."),
    ("fsdp", "dcp"): _h(
        "Save and load a sharded checkpoint (weights, optimizer state and step), each rank writing its own shards.",
        "Distributed checkpoints store shards plus metadata; loading fills an existing state dict in place, which "
        "must then be set back into the model and optimizer.",
        "torch.distributed.checkpoint: get_state_dict, dcp.save, dcp.load, set_state_dict."),
    ("fsdp", "deepspeed"): _h(
        "Write the DeepSpeed configuration for a ZeRO stage, a global batch and a world size.",
        "The global batch is split over the GPUs; only stages 1 to 3 exist.",
        "Keys zero_optimization.stage, train_batch_size, train_micro_batch_size_per_gpu, "
        "gradient_accumulation_steps, bf16.enabled."),
    # ---------------------------------------------------------------- pipeline
    ("pipeline", "naive"): _h(
        "Run one batch through this pipeline stage: forward and pass the activations on, then backward and pass the "
        "gradient back.",
        "Each stage receives from the previous one and sends to the next; the backward goes the other way.",
        "pipe.recv_forward, forward_compute, send_forward, then recv_backward, backward_compute, send_backward."),
    ("pipeline", "afab"): _h(
        "Pipeline the micro-batches GPipe-style: all forwards, then all backwards, in micro-batch order.",
        "While a stage works on one micro-batch, the previous stage already works on the next.",
        "Two loops over range(pipe.micro_batches), each call with its micro-batch number; in each loop receive, "
        "compute and send one micro-batch before the next (a transfer waits with the next compute)."),
    ("pipeline", "1f1b"): _h(
        "Schedule the micro-batches 1F1B: a warm-up of forwards, then one forward / one backward, then the "
        "remaining backwards, to bound the activations each stage keeps.",
        "Later stages need fewer warm-up forwards: the warm-up depends on the rank and never exceeds the number of "
        "micro-batches; the backward of the steady state is the oldest pending micro-batch.",
        "warmup = min(world_size - rank - 1, m); the forward and backward helpers written as receive, compute, "
        "send."),
    ("pipeline", "interleaved"): _h(
        "Schedule interleaved 1F1B: each rank holds several chunks, each micro-batch visits every rank several "
        "times, and a step's transfers go out together.",
        "Number the forwards in groups of world_size x chunks; the backward visits the chunks in reverse; in a "
        "steady step post both receives before both computes.",
        "The chunk= argument of every pipe call; a helper running a list of actions as receives, computes, sends."),
    # ---------------------------------------------------------------- tensor parallel
    ("tp", "1"): _h(
        "Write the forward and the backward of the four tensor-parallel communication primitives (copy, reduce, "
        "gather, scatter), as the class docstring describes.",
        "Each primitive is an autograd function whose backward is the 'opposite' collective: identity <-> "
        "all-reduce, all-gather <-> keep one's slice.",
        "torch.autograd.Function, dlo.parallel.comm.all_reduce / all_gather with the group and a phase."),
    ("tp", "2"): _h(
        "Split a linear layer by output features across the TP group (column parallel).",
        "Each rank keeps a slice of the weight's rows (and bias); the input's gradient must be summed over ranks.",
        "A cloned slice as nn.Parameter, copy_to_region on the input, optional gather_from_region on the output."),
    ("tp", "3"): _h(
        "Split a linear layer by input features across the TP group (row parallel).",
        "Each rank computes a partial output from its slice of the input; the partials are summed, the bias is "
        "added once.",
        "A slice of the weight's columns, reduce_from_region, bias after the reduction."),
    ("tp", "4"): _h(
        "Split the embedding table by vocabulary across the TP group.",
        "A rank only knows its range of ids: the others give zero rows, and the sum over ranks rebuilds the lookup.",
        "A mask of ids outside [start, end), shifted ids, F.embedding, reduce_from_region."),
    ("tp", "5"): _h(
        "Parallelise the SwiGLU MLP with one all-reduce in the forward and one in the backward.",
        "Gate and up projections are column parallel, the down projection row parallel, so the hidden activations "
        "never need communicating.",
        "Your ColumnParallelLinear (with copy_input=False) and RowParallelLinear; copy_to_region once."),
    ("tp", "6"): _h(
        "Parallelise attention by heads, keeping grouped-query groups together, and refuse a split that does not "
        "divide the heads.",
        "Each rank takes num_heads / tp query heads and num_kv_heads / tp K/V heads; the width of a rank's heads "
        "is heads x head_dim, which need not equal hidden / tp.",
        "Column-parallel q, k, v, row-parallel o; ValueError when tp does not divide the heads or K/V heads."),
    ("tp", "7"): _h(
        "Assemble the whole tensor-parallel Llama from your parallel layers, keeping the model's parameter names.",
        "Swap each layer for its parallel version in place; the logits and gradients must equal the single-process "
        "model's.",
        "Your VocabParallelEmbedding, ParallelAttention, ParallelSwiGLU and a column-parallel head."),
    ("tp", "8"): _h(
        "Compute the cross-entropy from vocabulary-sharded logits without gathering them.",
        "Log-sum-exp needs the global max and sum, and the target logit lives on one rank: three small reductions.",
        "reduce_from_region (so autograd reaches every rank) for the max-shifted sum of exponentials and the "
        "target logit; ignore_index -100."),
    ("tp", "9"): _h(
        "Build the tensor-parallel groups: contiguous blocks of ranks, every group created on every rank.",
        "new_group is collective: all ranks must create every group, in the same order, and keep their own.",
        "torch.distributed.new_group(ranks) in a loop; ValueError when tp does not divide the world size."),
    ("tp", "10"): _h(
        "Build the data-parallel groups: ranks with the same TP position, strided across the TP blocks.",
        "tp x dp must equal the world size; a DP group takes one rank from each TP block.",
        "Strided lists of ranks, torch.distributed.new_group; ValueError naming the world size."),
    ("tp", "11"): _h(
        "Combine TP with DP: shard the data by DP rank, average gradients and metrics over the DP group only.",
        "Ranks of one TP group see the same data; the DP group is where data differs and must be averaged.",
        "DistributedSampler(num_replicas=dp_size, rank=dp_rank), all_reduce over the DP group."),
    ("tp", "12"): _h(
        "Write the two sequence-parallel regions: before a column-parallel layer, collect every rank's tokens; "
        "after a row-parallel layer, sum the partial outputs but keep only this rank's tokens -- each with the "
        "backward that matches, so that norms and residual adds run on seq/tp tokens per rank.",
        "The sequence is split in tp contiguous chunks, rank r owning chunk r; the two regions are conjugate like f "
        "and g: the gradient of a gather is a sum over the ranks kept per chunk, the gradient of a reduce-scatter is "
        "gathered back. An all-reduce followed by a slice gives the same numbers but moves and keeps more.",
        "torch.autograd.Function; dlo.parallel.comm.all_gather_along and reduce_scatter_along with dim=1 (the "
        "sequence), the group, and phase='forward' or 'backward'."),
    # ---------------------------------------------------------------- context parallelism
    ("context", "merge"): _h(
        "Combine the attention of the same queries over two disjoint key sets into the attention over their union, "
        "with the log-sum-exp of the union, so that ring attention can add one key block at a time.",
        "A softmax over A and B is a weighted mix of the softmaxes over A and over B; each part's weight is its share "
        "of the denominator, exp(lse_part) / (exp(lse_a) + exp(lse_b)). Never exponentiate a raw lse: scores of a "
        "few hundred overflow float32.",
        "torch.logaddexp for the merged lse, torch.exp(lse_part - lse) for the weights, unsqueeze(-1) so that a "
        "[..., seq] weight multiplies a [..., seq, head_dim] output."),
    # ---------------------------------------------------------------- mixture of experts
    ("experts", "balance"): _h(
        "Compute the load-balancing loss of a mixture of experts, E times the sum over the experts of the fraction "
        "of routing decisions sent to each expert times its mean router probability, so that the router learns to "
        "spread the tokens.",
        "f_e counts decisions (every one of the k choices of every token, out of n · k) and carries no gradient; "
        "P_e is the router's mean probability for e over the tokens and carries the gradient. Uniform routing gives "
        "1, every token on one expert gives E.",
        "torch.bincount(expert_index.flatten(), minlength=num_experts) (or one_hot(...).sum), divided by "
        "expert_index.numel(); router_probs.mean(dim=0); (f * P).sum() times num_experts."),
}

# Classes a step's functions rely on, whose methods hold solution regions of that step.
HELPERS: dict[str, dict[str, tuple[str, str]]] = {
    "tp_tensor_parallel/tp_balises.py": {
        "CopyToRegion": ("tp", "1"), "ReduceFromRegion": ("tp", "1"),
        "GatherFromRegion": ("tp", "1"), "ScatterToRegion": ("tp", "1"),
        "GatherFromSequenceRegion": ("tp", "12"), "ReduceScatterToSequenceRegion": ("tp", "12"),
    },
}

LEVELS = 3


def hint_for(course: str, step: str) -> Hint:
    try:
        return HINTS[(course, step)]
    except KeyError:
        raise ValueError(f"no hints for {course}/{step}: `dlo check --list` shows the steps") from None


def goal(course: str, step: str) -> str:
    return hint_for(course, step).goal


def levels(course: str, step: str, near_code: str) -> list[str]:
    """The three hint levels of a step; ``near_code`` is level 3 (the source's outline of the solution)."""
    h = hint_for(course, step)
    return [f"Concept: {h.concept}", f"Tools: {h.tools}", f"Near-code: {near_code}"]


# --------------------------------------------------------------------------------------------------
# Which hint level each step has reached: `dlo hint` gives the next one each time
# --------------------------------------------------------------------------------------------------

STATE_FILE: Path = RUNS_DIR / "hints.json"  # runs/hints.json (DLO_RUNS_DIR moves it), {"course/step": level}


def _read_state(path: Path) -> dict[str, int]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, int) and 0 <= v <= LEVELS}


def next_level(course: str, step: str, level: int | None = None, state_file: str | Path | None = None) -> int:
    """The hint level to show now (the one after the last shown, or ``level``), remembered in ``state_file``."""
    return advance(course, step, level, state_file)[0]


def advance(course: str, step: str, level: int | None = None,
            state_file: str | Path | None = None) -> tuple[int, str | None]:
    """:func:`next_level`, and why the level could not be remembered (``None`` when it was): in a read-only
    checkout the hint is still shown, but the next call starts again from the same level."""
    hint_for(course, step)  # unknown steps: ValueError before anything is written
    path = Path(state_file) if state_file is not None else STATE_FILE
    state = _read_state(path)
    key = f"{course}/{step}"
    if level is None:
        level = min(state.get(key, 0) + 1, LEVELS)
    elif not 1 <= level <= LEVELS:
        raise ValueError(f"--level must be between 1 and {LEVELS}, got {level}")
    state[key] = level
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(state, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        return level, f"cannot write {path} ({exc.strerror or exc})"
    return level, None
