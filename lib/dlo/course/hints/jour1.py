"""Goals and hints of Jour 1 (jour1.ipynb, shapes.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour1
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
    # Jour1 shapes
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
}
