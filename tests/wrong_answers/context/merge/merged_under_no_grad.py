"""Right values, computed under torch.no_grad() "to save memory": nothing of the merge reaches autograd. Family:
values checked, gradients not."""
import torch

EXPECT = ["no gradient reaches"]


def merge_partial(out_a, lse_a, out_b, lse_b):
    with torch.no_grad():
        lse = torch.logaddexp(lse_a, lse_b)
        out = torch.exp(lse_a - lse).unsqueeze(-1) * out_a + torch.exp(lse_b - lse).unsqueeze(-1) * out_b
    return out, lse
