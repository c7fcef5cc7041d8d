"""Family: sizes that coincide. The KL summed over the batch (reduction='sum') instead of averaged over it: right
only for a batch of one."""
import torch.nn.functional as F

EXPECT = "the loss differs"


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    log_p_student = F.log_softmax(student_logits / T, dim=-1)
    p_teacher = F.softmax(teacher_logits.detach() / T, dim=-1)
    soft = F.kl_div(log_p_student, p_teacher, reduction="sum") * T ** 2
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)
