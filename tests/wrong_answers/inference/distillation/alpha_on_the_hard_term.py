"""alpha weighs the cross-entropy and 1 - alpha the teacher term (the convention read the other way round)."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = "alpha weighs the wrong term"


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    log_p_student = F.log_softmax(student_logits / T, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.detach() / T, dim=-1)
    soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * T**2
    return (1 - alpha) * soft + alpha * F.cross_entropy(student_logits, labels)
