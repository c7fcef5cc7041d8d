"""Right values, but the two weights are detached ("they are only coefficients"): no gradient flows to lse_a and
lse_b through the outputs, and the ring's backward gets wrong gradients for the scores. Family: values checked,
gradients not."""
import torch

EXPECT = ["gradient with respect to lse_a", "differs"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    lse = torch.logaddexp(lse_a, lse_b)
    wa, wb = torch.exp(lse_a - lse).detach(), torch.exp(lse_b - lse).detach()
    return wa.unsqueeze(-1) * out_a + wb.unsqueeze(-1) * out_b, lse
