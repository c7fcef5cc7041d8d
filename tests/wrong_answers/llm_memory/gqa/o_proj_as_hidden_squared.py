"""Family: sizes that coincide. o_proj counted as hidden × hidden: right whenever num_heads · head_dim = hidden (every
Llama), wrong when head_dim is not hidden / num_heads."""

EXPECT = "head_dim"


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    return hidden * num_heads * head_dim + 2 * hidden * num_kv_heads * head_dim + hidden * hidden
