"""Correct: one term per projection, the key/value width computed first."""


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    q_width, kv_width = num_heads * head_dim, num_kv_heads * head_dim
    q_proj = hidden * q_width
    k_proj = v_proj = hidden * kv_width
    o_proj = q_width * hidden
    return q_proj + k_proj + v_proj + o_proj
