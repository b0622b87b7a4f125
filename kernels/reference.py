"""Torch references for the paged-attention kernels: the engine's CPU path and the oracle in tests.

Cache layout: `[num_blocks, block_size, num_kv_heads, head_dim]`; slot = block * block_size + offset.
Queries of a request are its newest `q_len` tokens, bottom-right aligned with its `seqused_k` keys:
query i sees keys at positions <= seqused_k - q_len + i (FlashAttention's convention).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .buckets import length_buckets

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

    Gathers each request's pages and takes a masked softmax in fp32 (SDPA; GQA by broadcasting the KV heads).
    Single-query requests (decodes) go through padded, batched calls, grouped by context length; prefill
    chunks one by one.
    """
    cu = cu_seqlens_q.tolist()
    lens_k = seqused_k.tolist()
    decodes = sorted((i for i in range(len(lens_k)) if cu[i + 1] - cu[i] == 1), key=lambda i: lens_k[i])
    for group in length_buckets(decodes, lens_k):
        rows = torch.tensor([cu[i] for i in group], device=q.device)
        lens = seqused_k[group].long()
        k, v = _gather(k_cache, v_cache, block_table[group], lens_k[group[-1]])
        mask = torch.arange(k.shape[2], device=q.device)[None, :] < lens[:, None]  # [decodes, keys]
        for row, i in enumerate(group):  # zero the padding of our gathered copy: 0 * NaN would be NaN
            k[row, :, lens_k[i]:] = 0.0
            v[row, :, lens_k[i]:] = 0.0
        o = F.scaled_dot_product_attention(q[rows].float().unsqueeze(2), k, v, attn_mask=mask[:, None, None, :],
                                           scale=softmax_scale, enable_gqa=True)
        out[rows] = o.squeeze(2).to(out.dtype)
    for i, seqlen_k in enumerate(lens_k):
        q_start, q_end = cu[i], cu[i + 1]
        q_len = q_end - q_start
        if q_len <= 1:
            continue
        k, v = _gather(k_cache, v_cache, block_table[i:i + 1], seqlen_k)
        key_pos = torch.arange(seqlen_k, device=q.device)
        for row in range(0, q_len, QUERY_BLOCK):
            rows = min(QUERY_BLOCK, q_len - row)
            qi = q[q_start + row: q_start + row + rows].float().transpose(0, 1)[None]  # [1, heads, rows, dim]
            if q_len == seqlen_k and rows == q_len:  # no cached context: plain causal, the fast kernel
                o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=softmax_scale, enable_gqa=True)
            else:  # bottom-right aligned: query j of the chunk sees keys <= seqlen_k - q_len + j
                query_pos = seqlen_k - q_len + row + torch.arange(rows, device=q.device)
                mask = key_pos[None, :] <= query_pos[:, None]
                o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=softmax_scale, enable_gqa=True)
            out[q_start + row: q_start + row + rows] = o[0].transpose(0, 1).to(out.dtype)
    return out


def _gather(k_cache: torch.Tensor, v_cache: torch.Tensor, block_table: torch.Tensor,
            seqlen_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Pages of each row of `block_table` as fp32 `[rows, num_kv_heads, seqlen_k, head_dim]`: a fresh copy
    (advanced indexing copies), so callers may write into it."""
    pages = block_table[:, : -(-seqlen_k // k_cache.shape[1])].long()
    shape = (pages.shape[0], -1, *k_cache.shape[2:])
    k = k_cache[pages].reshape(shape)[:, :seqlen_k].transpose(1, 2).float()
    v = v_cache[pages].reshape(shape)[:, :seqlen_k].transpose(1, 2).float()
    return k, v
