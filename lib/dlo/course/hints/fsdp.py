"""Goals and hints of the FSDP workshop (fsdp.ipynb, apis.ipynb): see :mod:`dlo.course.hints` for what each level holds."""
from __future__ import annotations

from dlo.course.hints.base import Hint, h as _h

HINTS: dict[tuple[str, str], Hint] = {
    # FSDP
    ("fsdp", "ddp"): _h(
        "Build the DDP baseline: the model on its device, wrapped only when there are several processes.",
        "DDP replicates the whole model on every rank; it needs a process group.",
        "DistributedDataParallel(model, device_ids=... only on GPUs).",
        shape="Move the model to the device first. Then one branch on the context: a single process returns the model "
        "as it is; several processes return it wrapped for data parallelism, with device ids only when the device is "
        "a GPU."),
    ("fsdp", "fsdp"): _h(
        "Shard the model with FSDP2, one unit per decoder layer plus the root, passing every option you are given "
        "to each unit.",
        "Each unit is all-gathered before it runs and freed after: layers first, so that the root keeps only what "
        "no layer owns. Options given to only some units silently change the run (fp32 instead of bf16).",
        "torch.distributed.fsdp.fully_shard(module, mp_policy=..., offload_policy=..., reshard_after_forward=...).",
        shape="Gather the options once (precision policy, offload policy, resharding choice). Shard each decoder layer "
        "with them, in order; then shard the whole model with the same options, so that the root unit keeps only what "
        "no layer owns. Return the model."),
    ("fsdp", "precision"): _h(
        "Choose the mixed-precision policy for a precision name: compute in bf16 but reduce gradients in fp32.",
        "Summing gradients over many ranks in bf16 loses precision; fp32 needs no policy; unknown names are errors.",
        "MixedPrecisionPolicy(param_dtype=..., reduce_dtype=...), None, ValueError.",
        shape="A decision on the name: full precision means no policy at all; bf16 means a policy that computes in "
        "bf16 and reduces gradients in float32; any other name is an error that says which names exist."),
    ("fsdp", "checkpointing"): _h(
        "Make every decoder layer recompute its activations in the backward instead of storing them.",
        "Each layer keeps only its input; the wrapper must replace the layer in the model.",
        "checkpoint_wrapper from torch.distributed.algorithms._checkpoint.checkpoint_wrapper; assign into "
        "model.model.layers[i].",
        shape="For each position in the list of decoder layers, replace the layer by a wrapped version of itself that "
        "recomputes its activations in backward; the wrapped layers must end up in the model's list. Return the "
        "model."),
    ("fsdp", "reshard"): _h(
        "Let the caller choose whether each layer frees its gathered weights after the forward.",
        "Freeing saves memory but costs a second all-gather in the backward; the choice must reach every layer.",
        "The reshard_after_forward argument of fully_shard, on every call.",
        shape="The same sharding as the fsdp step, with the caller's resharding choice passed unchanged to every "
        "layer's call and to the root's: no layer keeps a default of its own."),
    ("fsdp", "offload"): _h(
        "Choose where the sharded state lives: on the GPU, or in CPU memory when asked on a GPU run.",
        "Offloading only makes sense from a GPU; page-locked memory makes the copies faster.",
        "OffloadPolicy(), CPUOffloadPolicy(pin_memory=...), ValueError on a CPU device.",
        shape="Three cases in order: not asked, a policy that offloads nothing; asked on a device that is not a GPU, "
        "an error saying there is nothing to offload; asked on a GPU, a CPU offload policy with page-locked memory. "
        "Decide from the device argument, not from the machine."),
    ("fsdp", "compile"): _h(
        "Compile each decoder layer in place, leaving the root uncompiled so that FSDP can wrap it.",
        "Per-layer graphs keep FSDP's per-layer hooks outside the compiled code.",
        "nn.Module.compile() on each layer (it compiles in place).",
        shape="For each decoder layer, compile it in place (the module itself stays in the list under its name); leave "
        "the root model alone. Return the model."),
    ("fsdp", "dcp"): _h(
        "Save and load a sharded checkpoint (weights, optimizer state and step), each rank writing its own shards.",
        "Distributed checkpoints store shards plus metadata; loading fills an existing state dict in place, which "
        "must then be set back into the model and optimizer.",
        "torch.distributed.checkpoint: get_state_dict, dcp.save, dcp.load, set_state_dict.",
        shape="Saving: get the model's and optimizer's (sharded) state dicts, put them in one dict with the step as a "
        "tensor, and let every rank save it to the folder. Loading: build a dict of the same shape from this model "
        "and optimizer, let every rank load into it in place, set the model's and optimizer's state from it, and "
        "return the step as an integer."),
    ("fsdp", "deepspeed"): _h(
        "Write the DeepSpeed configuration for a ZeRO stage, a global batch and a world size.",
        "The global batch is split over the GPUs; only stages 1 to 3 exist.",
        "Keys zero_optimization.stage, train_batch_size, train_micro_batch_size_per_gpu, "
        "gradient_accumulation_steps, bf16.enabled.",
        shape="Check the stage first (only 1 to 3). Then one dict: the global batch, the per-rank batch (the global "
        "batch split over the world, an error when it does not divide), one accumulation step, the ZeRO section with "
        "the stage, and a bf16 section enabled only for bf16."),
    # apis
    ("apis", "fabric_port"): _h(
        "Port the native training loop with gradient accumulation to Lightning Fabric: the same training on one "
        "device, and a loop that would run unchanged on several.",
        "Fabric takes over what depends on where the code runs -- the device, the wrapping of the model and its "
        "optimizer, the sharding of the data, the backward (loss scaling, the strategy's hooks) -- and leaves the "
        "loop itself to you. So the port removes the native loop's device handling and hands each of those jobs "
        "to Fabric; the accumulation arithmetic does not change.",
        "Fabric.setup (model and optimizer together) or setup_module + setup_optimizers, Fabric.setup_dataloaders, "
        "Fabric.backward, Fabric.no_backward_sync(module, enabled=...) for the micro-batches that do not end a step.",
        shape="Before the loop: the model with its optimizer, and the loader, each given to Fabric and replaced by "
              "what it returns. In the loop: the same steps and micro-batches as the native loop, the batches "
              "used as they come, each micro-batch's scaled loss given to Fabric's backward, then one optimizer "
              "step and one reset of the gradients per step; the returned losses as the native loop records them."),
}
