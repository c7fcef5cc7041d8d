"""Correct: the teacher's probabilities (not their log) given to F.kl_div, computed under no_grad, the hard loss
weighted first."""
import torch
import torch.nn.functional as F


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    with torch.no_grad():
        p_teacher = F.softmax(teacher_logits / T, dim=-1)
    hard = F.cross_entropy(student_logits, labels)
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=-1), p_teacher, reduction="batchmean") * (T * T)
    return (1 - alpha) * hard + alpha * soft
