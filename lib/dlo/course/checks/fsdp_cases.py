"""What the fsdp checkers run the student's functions on: small causal LMs shaped like transformers' Llama
(``model.model.embed_tokens``, ``model.model.layers``, ``model.model.norm``, ``model.lm_head``, ``model(input_ids=...)
.logits``), of several widths and depths, and the training steps both the answer and the reference take.

Why not transformers' own Llama here: the checks' processes are forked from a server that has not imported
transformers, and importing it costs each process 10-15 s on a busy machine; these models import nothing but torch,
so one launch can try several widths and depths (and widths that 3 ranks cannot split evenly) in a few seconds. The
functions checked only reach the model through that Llama-shaped surface.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn
import torch.nn.functional as F

from dlo.course.checks.cases import compare


@dataclass(frozen=True)
class Shape:
    """A model of the checks: ``layers`` decoder layers of width ``hidden`` (MLP ``2 * hidden + 3``), ``vocab``
    tokens, the head tied to the embedding or not, initialised from ``seed``."""

    hidden: int
    layers: int
    vocab: int = 40
    tie: bool = True
    seed: int = 0

    @property
    def label(self) -> str:
        return (f"{self.layers} layer{'s' * (self.layers > 1)} of width {self.hidden}, vocabulary {self.vocab}, "
                f"{'tied' if self.tie else 'separate'} head, seed {self.seed}")


#: The models a check tries: one layer and several, widths 3 ranks do not divide (FSDP pads the last shard), a tied
#: and a separate head, different seeds.
SHAPES = (Shape(16, 1, tie=True, seed=0), Shape(22, 3, vocab=35, tie=False, seed=1), Shape(20, 2, seed=2))


class Output(NamedTuple):
    """What the model returns, like transformers' outputs: ``.logits``. A named tuple, so that FSDP2 finds the
    tensor in it (to hook the backward that must gather the root's weights again)."""

    logits: torch.Tensor


class Norm(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class MLP(nn.Module):
    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, 2 * hidden + 3, bias=False)
        self.down_proj = nn.Linear(2 * hidden + 3, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.up_proj(x)))


class Mix(nn.Module):
    """Causal mixing over the sequence (a running mean of a projection): what attention does for these checks."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.v_proj = nn.Linear(hidden, hidden, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = self.v_proj(x)
        steps = torch.arange(1, x.shape[1] + 1, dtype=v.dtype, device=v.device).view(1, -1, 1)
        return self.o_proj(v.cumsum(1) / steps)


class Layer(nn.Module):
    """A decoder layer: ``calls`` counts its MLP's forwards (a checkpointed layer runs it again in backward)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.input_layernorm, self.self_attn = Norm(hidden), Mix(hidden)
        self.post_attention_layernorm, self.mlp = Norm(hidden), MLP(hidden)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class Body(nn.Module):
    def __init__(self, shape: Shape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab, shape.hidden)
        self.layers = nn.ModuleList(Layer(shape.hidden) for _ in range(shape.layers))
        self.norm = Norm(shape.hidden)


class TinyLM(nn.Module):
    """A Llama-shaped causal LM of :class:`Shape` ``shape``, the same weights for the same shape on every rank."""

    def __init__(self, shape: Shape) -> None:
        super().__init__()
        torch.manual_seed(shape.seed)
        self.shape = shape
        self.model = Body(shape)
        self.lm_head = nn.Linear(shape.hidden, shape.vocab, bias=False)
        if shape.tie:
            self.lm_head.weight = self.model.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor) -> Output:
        x = self.model.embed_tokens(input_ids)
        for layer in self.model.layers:
            x = layer(x)
        return Output(self.lm_head(self.model.norm(x)))


def batch(shape: Shape, rank: int, step: int, size: int = 2, length: int = 7) -> torch.Tensor:
    """Token ids of ``rank``'s batch at ``step`` (different on every rank and step)."""
    g = torch.Generator().manual_seed(1000 * shape.seed + 100 * step + rank)
    return torch.randint(0, shape.vocab, (size, length), generator=g)


def loss_of(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids=ids).logits
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def train(model: nn.Module, shape: Shape, rank: int, steps: int = 2, lr: float = 0.5) -> list[float]:
    """``steps`` SGD steps (momentum 0.9) on ``rank``'s batches; the losses. SGD, not Adam: its step is proportional
    to the gradient, so gradients summed over the ranks instead of averaged change the weights."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    losses = []
    for step in range(steps):
        loss = loss_of(model, batch(shape, rank, step))
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def full(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor (a DTensor gathered from every rank: collective)."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def local_numel(t: torch.Tensor) -> int:
    """How many elements this rank holds of ``t`` (its shard for a DTensor)."""
    return t.to_local().numel() if hasattr(t, "to_local") else t.numel()


def weights_problem(got: nn.Module, want: nn.Module, what: str = "the weight", *, grads: bool = False
                    ) -> str | None:
    """The first parameter of ``got`` whose whole value (with ``grads``, whose gradient) differs from ``want``'s
    (float32 rounding allowed), named as in ``want``: ``"<what> of <name> differs by ..."``. Parameters are matched
    in order (a wrapper renames them, it does not reorder them). Collective for sharded models: every rank must
    call it."""
    def value(p: torch.Tensor) -> torch.Tensor | None:
        t = p.grad if grads else p
        return None if t is None else full(t.detach())

    mine = [value(p) for p in got.parameters()]  # every rank gathers every parameter, whatever it finds
    wanted = [(n, value(p)) for n, p in want.named_parameters()]
    if len(mine) != len(wanted):
        return f"the model has {len(mine)} parameters, expected {len(wanted)}"
    for a, (name, b) in zip(mine, wanted):
        if a is None or b is None:
            problem = None if a is b else f"{what} of {name} is {'missing' if a is None else 'there'}, expected " \
                                          f"{'one' if a is None else 'none'}"
        else:
            problem = compare(a, b, f"{what} of {name}", scale=20)
        if problem:
            return problem
    return None
