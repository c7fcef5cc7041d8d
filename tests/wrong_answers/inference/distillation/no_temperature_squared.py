"""Forgets the T² factor: the soft term's gradients shrink as 1/T²."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "T²"


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=-1), F.log_softmax(teacher_logits.detach() / T, dim=-1),
                    reduction="batchmean", log_target=True)
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)
