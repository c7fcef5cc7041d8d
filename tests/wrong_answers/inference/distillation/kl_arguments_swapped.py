"""F.kl_div(teacher, student): KL in the wrong direction (and the teacher gets the gradient)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "wrong direction"


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    soft = F.kl_div(F.log_softmax(teacher_logits / T, dim=-1), F.log_softmax(student_logits / T, dim=-1),
                    reduction="batchmean", log_target=True) * T**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)
