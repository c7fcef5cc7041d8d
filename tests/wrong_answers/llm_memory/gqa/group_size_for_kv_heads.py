"""Family: sizes that coincide. k and v counted with num_heads // num_kv_heads heads (the group size) instead of
num_kv_heads: the same only when both are equal (e.g. 4 heads in 2 groups of 2)."""

EXPECT = "expected"


def attention_params(hidden, num_heads, num_kv_heads, head_dim):
    group = num_heads // num_kv_heads
    return 2 * hidden * num_heads * head_dim + 2 * hidden * group * head_dim
