"""The teacher's soft targets are computed at T = 1; only the student's logits are divided by T."""
import math

import torch
import torch.nn.functional as F
from torch import nn

EXPECT = ["temperature", "teacher"]


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    log_p_student = F.log_softmax(student_logits / T, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.detach(), dim=-1)
    soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * T**2
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)
