"""What an accumulated FSDP2 step communicates (tests/test_fsdp_levers.py): after each micro-batch of a 3-micro-batch
step, how many sharded parameters already hold a reduced gradient. ``accum_sync="last"`` reduce-scatters once, after
the last micro-batch (none before it); ``"every"`` after every micro-batch. Usage: ``accum_sync_cases.py``."""
import contextlib

import torch

import dlo  # noqa: F401
from dlo.data import tokens
from dlo.parallel import fsdp
from dlo.parallel.fsdp import prefetch
from dlo.runtime import exit_after_success, init_distributed, write_record

ctx = init_distributed(backend="gloo", device="cpu", timeout_s=120)
cfg = fsdp.SMOKE_LLAMA
dataset, _ = tokens.token_dataset(16, vocab_size=cfg.vocab_size, n_sequences=24)
ids, labels = next(fsdp.batches(dataset, 6 * ctx.world_size, ctx.rank, ctx.world_size))
seen: list[int] = []
real = prefetch._micro_batch


@contextlib.contextmanager
def spied(model, last, sync, keep_gathered):
    with real(model, last, sync, keep_gathered):
        yield
    seen.append(sum(p.grad is not None for p in model.parameters()))


prefetch._micro_batch = spied
for mode in ("last", "every"):
    model = fsdp.apply_fsdp(fsdp.build_llama(cfg))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen.clear()
    fsdp.train_step(model, opt, ids, labels, grad_accum=3, accum_sync=mode)
    write_record({"mode": mode, "reduced_after_each": list(seen), "params": len(list(model.parameters()))})
exit_after_success()
