"""Goals and hints of Jour 1 (jour1.ipynb, shapes.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # Jour1
    ("jour1", "device"): _h(
        "Move a batch (images and labels) to the training device, so that the copy can overlap the GPU's work.",
        "A host-to-device copy from pinned memory can run asynchronously: the CPU queues it and goes on preparing "
        "the next step, while the GPU still computes the previous one. A synchronous copy makes the CPU wait.",
        "Tensor.to(device, non_blocking=...) on each of the two tensors; return them as a pair.",
        shape="Two independent copies, one per tensor, each to the device you are given (not one you choose "
              "yourself), each asked to be asynchronous; each tensor is copied once, and both come back together, "
              "images first."),
    ("jour1", "amp"): _h(
        "Run one training step with the forward pass in reduced precision (the dtype you are given), keeping the "
        "weights, the gradients and the update in fp32.",
        "Autocast changes the dtype of the operations run inside it, not the parameters; only the forward (and "
        "the loss) belongs inside it. The backward follows the forward's dtypes by itself, and the update must "
        "see fp32 gradients.",
        "torch.autocast(device_type=..., dtype=...) as a context manager around the forward and the loss.",
        shape="Open a reduced-precision region for the device of the images, with the dtype passed in; inside it "
              "run the model and the criterion; close it; then the rest of the step (clear, backward, step) runs "
              "outside it, as before."),
    ("jour1", "fp16"): _h(
        "Finish an fp16 training step so that small gradients do not underflow to zero, and the update keeps its "
        "true size.",
        "fp16 cannot represent very small gradients: multiply the loss by a large factor before the backward, "
        "divide the gradients by it before the update, and skip steps whose gradients overflowed. The factor "
        "itself adapts: lowered after an overflow, raised after a run of good steps.",
        "torch.amp.GradScaler: its scale(...) method on the loss (the backward goes through what it returns), "
        "then its step(optimizer) and update() methods.",
        shape="Three moves, in this order: the backward runs on the multiplied loss; the optimizer's step goes "
              "through the scaler (which divides the gradients back and may skip the step); then the scaler "
              "adjusts its factor for the next step. The optimizer is never stepped directly."),
    ("jour1", "fp16_clip"): _h(
        "Write an fp16 training step whose gradients are clipped to a total norm of max_norm in their true units "
        "(not in the loss scale's), and whose update is still skipped when they overflow.",
        "After a scaled backward the gradients are the true ones times the scale: their norm must be measured "
        "after dividing them back, once, and the scaler must know they are already divided so that its step "
        "neither divides them again nor forgets to skip an overflowed step.",
        "The scaler's scale(...) for the backward, its unscale_(optimizer) method, "
        "torch.nn.utils.clip_grad_norm_ on the model's parameters, then the scaler's step(optimizer) and update().",
        shape="Backward on the multiplied loss; then have the scaler divide the gradients back (once, by itself, "
              "not by hand) so that they are in true units; then scale all gradients together down to a total norm "
              "of at most max_norm (the norm of all of them, not each value apart); then the scaler's step and its "
              "update, as in the previous exercise."),
    ("jour1", "channels_last"): _h(
        "Store the model's weights and the images in NHWC memory layout, without changing their shapes or values, "
        "so that Tensor Cores read convolutions' inputs contiguously.",
        "The memory format is a layout (strides), not a shape: NCHW tensors can be stored channels-last. Both sides "
        "of a convolution must use it, or PyTorch converts back and forth at every layer.",
        "torch.channels_last as memory_format for the model's .to(...) and for the images' .contiguous(...).",
        shape="Two conversions: the module's parameters (a module converts itself and returns itself), and the "
              "images (a tensor conversion returns a new tensor: keep what it returns). No axis is moved: the "
              "shapes stay (N, C, H, W)."),
    ("jour1", "cudnn"): _h(
        "Let cuDNN time its convolution algorithms for each input shape and keep the fastest one.",
        "cuDNN has several algorithms per convolution; an autotuner can try them on the first call of a shape and "
        "remember the fastest. It pays off when the shapes do not change from step to step.",
        "A flag in torch.backends.cudnn (not `enabled`, not `deterministic`, not `benchmark_limit`).",
        shape="One global switch, turned on for the rest of the process (not inside a block that turns it off "
              "again at its end); nothing to return."),
    ("jour1", "compile"): _h(
        "Return a compiled version of the model you are given, so that its operations get fused into fewer kernels.",
        "Compilation is lazy: wrapping costs nothing, the first call traces and compiles. The default compiler "
        "(Inductor) is the one that generates fused kernels; other backends only trace.",
        "torch.compile, applied to the model itself (not a copy, not its forward method); return what it returns. "
        "nn.Module.compile() is the in-place variant.",
        shape="One call on the very module you were given, with the default compiler; what you return is still a "
              "module (parameters, train/eval) whose calls go through the compiled code."),
    ("jour1", "batch_sweep"): _h(
        "Try growing batch sizes until one does not fit in memory, and report the largest that did, without hiding "
        "any other kind of error.",
        "Only an out-of-memory error means 'too big': any other exception is a bug that must stay visible. Stop at "
        "the first batch that does not fit. The largest batch that fits is not always the fastest one: report the "
        "largest.",
        "try/except on torch.OutOfMemoryError only (not RuntimeError, its parent), break out of the loop.",
        shape="Walk the sizes in the order given; for each, try it and keep its result; at the first "
              "out-of-memory failure stop walking; any other failure goes up to the caller. The answer is the size "
              "of the last result kept (nothing when none fitted), with the list of results."),
    ("jour1", "profiler"): _h(
        "Profile a few training steps, skipping the first (slow) ones, and write a trace TensorBoard or Perfetto "
        "can open.",
        "The first steps pay for warm-up (allocations, autotuning, compilation): a schedule waits, warms up, then "
        "records only the active steps, and it only advances when told that a step ended.",
        "torch.profiler.profile(activities=..., schedule=torch.profiler.schedule(...), on_trace_ready="
        "torch.profiler.tensorboard_trace_handler(...)), and the profiler's step() method after each step.",
        shape="One profiler configured with the three counts you are given (not numbers of your own) and a "
              "handler that writes the trace into the folder; inside it, as many steps as the three counts add "
              "up to, each followed by telling the profiler that a step ended; return the profiler."),
    ("jour1", "evaluate"): _h(
        "Compute a model's accuracy over batches as fast as possible: no autograd graph, BatchNorm with its running "
        "statistics, and an exact count even when batches differ in size.",
        "Evaluation needs neither gradients nor batch statistics; accuracy is correct predictions over all images, "
        "not a mean of batch means (the last batch is often smaller).",
        "model.eval(), torch.inference_mode(), argmax over the classes; return a Python float.",
        shape="Switch the model to evaluation behaviour; then, with autograd off, for every batch count the images "
              "whose highest-scoring class is the label, and count the images; at the end, one division of the two "
              "totals, returned as a plain number."),
    ("jour1", "timer"): _h(
        "Time a training step honestly: a few untimed calls first, then each timed call measured alone, from an idle "
        "device to the end of its work; return the seconds of each timed call.",
        "A GPU runs asynchronously: a step returns as soon as its kernels are queued, so a clock read right after it "
        "measures the launch, not the work. The clock may only start when nothing is left queued from earlier calls, "
        "and only stop once the device has finished. The first calls pay one-off costs (allocation, autotuning, "
        "compilation) that later calls do not: they run, but are not timed.",
        "time.perf_counter() (seconds, a float) or time.perf_counter_ns() (integer nanoseconds); the sync function "
        "you are given (torch.cuda.synchronize on a GPU, nothing on a CPU); a list of floats.",
        shape="First the warm-up: the step called the given number of times, no clock. Then, once per timed call: "
              "the device idle (wait for it), a clock reading, the step, wait for the device, a second reading; keep "
              "the difference in seconds. Return the differences, one per timed call, in the order of the calls."),
    # Jour1 shapes
    ("shapes", "intensity"): _h(
        "Compute the arithmetic intensity (FLOPs per byte moved) of a matrix product, to place it on the roofline.",
        "Each output element of a product is a sum of k products: a multiply and an add each. At best the product "
        "reads both inputs once and writes the output once; the bytes depend on the dtype.",
        "Python's true division (/, not //); the four arguments m, n, k and bytes_per_element.",
        shape="Two quantities, then their ratio: the operations (two per term of every output element's sum), and "
              "the bytes (the elements of the two inputs and of the output, each counted once, times the size of "
              "one element in the dtype given)."),
    ("shapes", "roofline"): _h(
        "Give the FLOP/s a kernel can reach on a GPU, from its arithmetic intensity, the peak compute and the "
        "memory bandwidth.",
        "Below the knee the memory feeds too slowly (memory-bound); above it the compute units are the limit. The "
        "bound is whichever roof is lower at that intensity.",
        "Python's built-in min; the arguments, in FLOP/s and bytes/s (no unit conversion).",
        shape="Two roofs at this intensity: the compute peak, and what the memory can feed (bytes per second times "
              "FLOPs per byte); the answer is the lower of the two, in FLOP/s, from the arguments you are given."),
    ("shapes", "padding"): _h(
        "Round a dimension up to the next multiple of k, so that matrix shapes suit the Tensor Cores.",
        "The smallest multiple of k that is at least n; n itself when it already is one. Integers stay exact; "
        "floating-point division loses digits on large sizes.",
        "Integer floor division // and the remainder %; return an int.",
        shape="How many whole blocks of k are needed to hold n (rounding up, in integers), times k."),
}
