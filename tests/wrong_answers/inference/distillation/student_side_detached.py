"""Family: values checked, gradients not. The student's soft log-probabilities computed from detached logits (the
detach put on the wrong side): the loss has the right value, but only the cross-entropy trains the student."""
import torch.nn.functional as F

EXPECT = "gradient of student_logits"


def distillation_loss(student_logits, teacher_logits, labels, T, alpha):
    log_p_student = F.log_softmax(student_logits.detach() / T, dim=-1)
    log_p_teacher = F.log_softmax(teacher_logits.detach() / T, dim=-1)
    soft = F.kl_div(log_p_student, log_p_teacher, reduction="batchmean", log_target=True) * T ** 2
    return alpha * soft + (1 - alpha) * F.cross_entropy(student_logits, labels)
