"""Torch references for the paged-attention kernels: the engine's CPU path and the oracle in tests.

Cache layout: `[num_blocks, block_size, num_kv_heads, head_dim]`; slot = block * block_size + offset.
Queries of a request are its newest `q_len` tokens, bottom-right aligned with its `seqused_k` keys:
query i sees keys at positions <= seqused_k - q_len + i (FlashAttention's convention).

Which cache slots each request reads depends only on the step, not on the layer, so `plan_ref` turns the
block table into gather indices and masks once per step (`AttentionPlan`) and every layer reuses them: a layer
then gathers its keys with one `index_select` per request group and makes one SDPA call per group. The engine
plans with `direct_decodes` where cpu_decode.py's C kernel applies: its decodes then read the cache in place
(`DirectDecodes`), and only prefill chunks take the gathers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from .buckets import length_buckets

QUERY_BLOCK = 1024  # rows of queries per masked softmax, bounding the mask and score matrix on long chunks


@dataclass
class DecodeGroup:
    """Single-query requests of similar context length, attended in one padded SDPA call."""

    rows: torch.Tensor  # [G] their query rows in the flattened batch
    slots: torch.Tensor  # [G * L] cache slots of their keys, padding pointed at each request's own last key
    width: int  # L, the longest context of the group
    mask: torch.Tensor | None  # [G, 1, 1, L] additive (0 / -inf) over the padding; None when none is padded


@dataclass
class PrefillChunk:
    """A chunk of more than one query: plain causal SDPA without cached context, else masked row blocks."""

    q_start: int
    q_len: int
    slots: torch.Tensor  # [seqlen_k] cache slots of its keys in order
    causal: bool  # no cached context: the fast causal kernel over the whole chunk
    masks: list[torch.Tensor] = field(default_factory=list)  # per QUERY_BLOCK rows: [rows, keys] bool


@dataclass
class DirectDecodes:
    """Single-query requests attended by cpu_decode.py's kernel, straight from the paged cache."""

    rows: torch.Tensor  # [R] int64, their query rows in the flattened batch
    block_table: torch.Tensor  # [R, max_blocks] int32, their rows of the step's table
    seqlens: torch.Tensor  # [R] int32, their key counts


@dataclass
class AttentionPlan:
    decodes: list[DecodeGroup]
    prefills: list[PrefillChunk]
    direct: DirectDecodes | None = None


def write_kv_ref(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Scatter `key`/`value` rows `[num_tokens, num_kv_heads, head_dim]` into their slots; slot -1 is skipped."""
    keep = slot_mapping >= 0
    if bool(keep.all()):  # the engine's steps: every token has a slot, no boolean indexing needed
        slots = slot_mapping.long()
        k_cache.view(-1, *k_cache.shape[2:]).index_copy_(0, slots, key.to(k_cache.dtype))
        v_cache.view(-1, *v_cache.shape[2:]).index_copy_(0, slots, value.to(v_cache.dtype))
        return
    slots = slot_mapping[keep].long()
    k_cache.view(-1, *k_cache.shape[2:])[slots] = key[keep].to(k_cache.dtype)
    v_cache.view(-1, *v_cache.shape[2:])[slots] = value[keep].to(v_cache.dtype)


def plan_ref(
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    block_size: int,
    direct_decodes: bool = False,
) -> AttentionPlan:
    """Gather indices and masks of one step, shared by all its layers; with `direct_decodes`, the decodes'
    rows and table for cpu_decode.py instead of their gathers."""
    device = block_table.device
    cu = cu_seqlens_q.tolist()
    lens_k = seqused_k.tolist()
    table = block_table.long()
    decodes = sorted((i for i in range(len(lens_k)) if cu[i + 1] - cu[i] == 1), key=lambda i: lens_k[i])
    groups, direct = [], None
    if direct_decodes and decodes:
        which = torch.tensor(decodes, device=device)
        direct = DirectDecodes(
            cu_seqlens_q[which].long(), block_table[which].int().contiguous(), seqused_k[which].int().contiguous()
        )
        decodes = []
    for group in length_buckets(decodes, lens_k):
        width = lens_k[group[-1]]
        lens = seqused_k[group].long()
        keys = torch.arange(width, device=device)
        pos = torch.minimum(keys[None, :], lens[:, None] - 1)  # padding reads the request's own last key
        slots = table[group].gather(1, pos // block_size) * block_size + pos % block_size
        mask = None
        if lens_k[group[0]] != width:
            mask = torch.zeros(len(group), 1, 1, width, device=device)
            mask.masked_fill_((keys[None, :] >= lens[:, None])[:, None, None, :], float("-inf"))
        groups.append(DecodeGroup(torch.tensor([cu[i] for i in group], device=device), slots.reshape(-1), width, mask))
    prefills = []
    for i, seqlen_k in enumerate(lens_k):
        q_start, q_len = cu[i], cu[i + 1] - cu[i]
        if q_len <= 1:
            continue
        pos = torch.arange(seqlen_k, device=device)
        chunk = PrefillChunk(
            q_start, q_len, table[i, pos // block_size] * block_size + pos % block_size, causal=q_len == seqlen_k
        )
        if not chunk.causal:  # bottom-right aligned: query j of the chunk sees keys <= seqlen_k - q_len + j
            for row in range(0, q_len, QUERY_BLOCK):
                query_pos = seqlen_k - q_len + row + torch.arange(min(QUERY_BLOCK, q_len - row), device=device)
                chunk.masks.append(pos[None, :] <= query_pos[:, None])
        prefills.append(chunk)
    return AttentionPlan(groups, prefills, direct)


def paged_attention_ref(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    out: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seqused_k: torch.Tensor,
    block_table: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    plan: AttentionPlan | None = None,
) -> torch.Tensor:
    """Attention of a flattened mixed batch `q [num_tokens, num_heads, head_dim]` over the paged cache.

    Gathers each request's keys by slot and takes the softmax in fp32 (SDPA). Single-query requests
    (decodes) go through padded, batched calls, grouped by context length, with a KV head's query heads
    as the rows of one query block (read once per KV head, not once per query head); prefill chunks one by
    one. `plan`: this step's `plan_ref`, built here when not given.
    """
    if plan is None:
        plan = plan_ref(cu_seqlens_q, seqused_k, block_table, k_cache.shape[1])
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    k_flat, v_flat = k_cache.view(-1, num_kv_heads, head_dim), v_cache.view(-1, num_kv_heads, head_dim)
    for g in plan.decodes:
        n = g.rows.shape[0]
        k = k_flat.index_select(0, g.slots).view(n, g.width, num_kv_heads, head_dim).transpose(1, 2).float()
        v = v_flat.index_select(0, g.slots).view(n, g.width, num_kv_heads, head_dim).transpose(1, 2).float()
        qg = q.index_select(0, g.rows).float().view(n, num_kv_heads, num_heads // num_kv_heads, head_dim)
        o = F.scaled_dot_product_attention(qg, k, v, attn_mask=g.mask, scale=softmax_scale)
        out.index_copy_(0, g.rows, o.reshape(n, num_heads, head_dim).to(out.dtype))
    if plan.direct is not None:
        from .cpu_decode import decode_attention

        d = plan.direct
        decode_attention(q, k_cache, v_cache, out, d.rows, d.block_table, d.seqlens, softmax_scale)
    for c in plan.prefills:
        k = k_flat.index_select(0, c.slots).transpose(0, 1)[None].float()  # [1, kv_heads, keys, dim]
        v = v_flat.index_select(0, c.slots).transpose(0, 1)[None].float()
        if c.causal:
            qi = q[c.q_start : c.q_start + c.q_len].float().transpose(0, 1)[None]  # [1, heads, rows, dim]
            o = F.scaled_dot_product_attention(qi, k, v, is_causal=True, scale=softmax_scale, enable_gqa=True)
            out[c.q_start : c.q_start + c.q_len] = o[0].transpose(0, 1).to(out.dtype)
            continue
        for block, mask in enumerate(c.masks):
            start = c.q_start + block * QUERY_BLOCK
            rows = mask.shape[0]
            qi = q[start : start + rows].float().transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask, scale=softmax_scale, enable_gqa=True)
            out[start : start + rows] = o[0].transpose(0, 1).to(out.dtype)
    return out
