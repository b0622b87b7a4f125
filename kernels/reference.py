"""Torch references for the paged-attention kernels: the engine's CPU path and the oracle in tests.

Cache layout: `[num_blocks, block_size, num_kv_heads, head_dim]`; slot = block * block_size + offset.
Queries of a request are its newest `q_len` tokens, bottom-right aligned with its `seqused_k` keys:
query i sees keys at positions <= seqused_k - q_len + i (FlashAttention's convention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QUERY_BLOCK = 1024  # rows of queries per softmax, bounding the score matrix on long prompts


def write_kv_ref(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 slot_mapping: torch.Tensor) -> None:
    """Scatter `key`/`value` rows `[num_tokens, num_kv_heads, head_dim]` into their slots; slot -1 is skipped."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def paged_attention_ref(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, out: torch.Tensor,
                        cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor,
                        max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float) -> torch.Tensor:
    """Attention of a flattened mixed batch `q [num_tokens, num_heads, head_dim]` over the paged cache.

    Gathers each request's pages, repeats KV heads for GQA and takes a masked softmax in fp32.
    """
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = q.shape[1] // num_kv_heads
    cu = cu_seqlens_q.tolist()
    lens_k = seqused_k.tolist()
    for i, seqlen_k in enumerate(lens_k):
        q_start, q_end = cu[i], cu[i + 1]
        q_len = q_end - q_start
        if q_len == 0:
            continue
        pages = block_table[i, : -(-seqlen_k // block_size)].long()
        k = k_cache[pages].reshape(-1, num_kv_heads, k_cache.shape[3])[:seqlen_k]
        v = v_cache[pages].reshape(-1, num_kv_heads, v_cache.shape[3])[:seqlen_k]
        k = k.float().repeat_interleave(group, dim=1).transpose(0, 1)  # [heads, seqlen_k, head_dim]
        v = v.float().repeat_interleave(group, dim=1).transpose(0, 1)
        key_pos = torch.arange(seqlen_k, device=q.device)
        for row in range(0, q_len, QUERY_BLOCK):
            rows = min(QUERY_BLOCK, q_len - row)
            qi = q[q_start + row: q_start + row + rows].float().transpose(0, 1)  # [heads, rows, head_dim]
            query_pos = seqlen_k - q_len + row + torch.arange(rows, device=q.device)
            mask = key_pos[None, :] <= query_pos[:, None]
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=softmax_scale)
            out[q_start + row: q_start + row + rows] = o.transpose(0, 1).to(out.dtype)
    return out
