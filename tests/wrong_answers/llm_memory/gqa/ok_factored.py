"""Correct: the four projections factored: 2 * hidden * head_dim * (num_heads + num_kv_heads)."""


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    return 2 * hidden * head_dim * (num_heads + num_kv_heads)
