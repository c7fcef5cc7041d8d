"""Correct: the KL divergence written out (sum over classes of p_teacher * (log p_teacher - log p_student)),
averaged over the batch."""
import torch
import torch.nn.functional as F


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    with torch.no_grad():
        log_q = torch.log_softmax(teacher_logits / T, dim=1)
    log_p = torch.log_softmax(student_logits / T, dim=1)
    kl = (log_q.exp() * (log_q - log_p)).sum(dim=1).mean()
    hard = F.cross_entropy(student_logits, labels)
    return alpha * (T * T) * kl + (1 - alpha) * hard
