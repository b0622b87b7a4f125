"""Triton kernels: KV write into the paged cache, and one paged-attention launch for a mixed batch.

Same contracts as reference.py. On a CPU they run under the Triton interpreter (TRITON_INTERPRET=1, set by
the executor and the tests before this module is imported), which is how CI proves them correct.

paged_attention: a program owns BLOCK_Q query tokens of one request and one KV head. The query heads that
share that KV head (GQA) are packed into the tile's rows (row = token * GROUP_PAD + head in group), so every
K/V tile is loaded once for the whole group. Keys are walked in tiles of BLOCK_N, each key's page looked up
in the block table; online softmax in fp32 (exp2); causal masking bottom-right aligned, and the key loop
stops at the last key the program's last query can see.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _write_kv_kernel(
    key_ptr,
    value_ptr,
    k_cache_ptr,
    v_cache_ptr,
    slot_ptr,
    key_stride_t,
    key_stride_h,
    key_stride_d,
    value_stride_t,
    value_stride_h,
    value_stride_d,
    cache_stride_b,
    cache_stride_s,
    cache_stride_h,
    cache_stride_d,
    block_size,
    head_dim,
    row_size,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:  # padding: nothing to write
        return
    offs = tl.arange(0, BLOCK)
    mask = offs < row_size
    head, dim = offs // head_dim, offs % head_dim
    block, offset = slot // block_size, slot % block_size
    k = tl.load(key_ptr + token * key_stride_t + head * key_stride_h + dim * key_stride_d, mask=mask)
    v = tl.load(value_ptr + token * value_stride_t + head * value_stride_h + dim * value_stride_d, mask=mask)
    dst = block * cache_stride_b + offset * cache_stride_s + head * cache_stride_h + dim * cache_stride_d
    tl.store(k_cache_ptr + dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_cache_ptr + dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """key/value `[num_tokens, num_kv_heads, head_dim]` (any strides) into `[blocks, block_size, heads, dim]`."""
    num_tokens, num_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    assert k_cache.stride() == v_cache.stride()
    row = num_heads * head_dim
    _write_kv_kernel[(num_tokens,)](
        key,
        value,
        k_cache,
        v_cache,
        slot_mapping,
        *key.stride(),
        *value.stride(),
        *k_cache.stride(),
        k_cache.shape[1],
        head_dim,
        row,
        BLOCK=triton.next_power_of_2(row),
    )


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    out_ptr,
    cu_seqlens_q_ptr,
    seqused_k_ptr,
    block_table_ptr,
    q_stride_t,
    q_stride_h,
    out_stride_t,
    out_stride_h,
    cache_stride_b,
    cache_stride_s,
    cache_stride_h,
    block_table_stride,
    scale_log2,
    block_size,
    GROUP: tl.constexpr,
    GROUP_PAD: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    HEAD_DIM_PAD: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    IEEE: tl.constexpr,
):
    request = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)
    q_start = tl.load(cu_seqlens_q_ptr + request)
    q_len = tl.load(cu_seqlens_q_ptr + request + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    seqlen_k = tl.load(seqused_k_ptr + request)
    context = seqlen_k - q_len  # keys before this request's first query

    rows = tl.arange(0, BLOCK_Q * GROUP_PAD)
    token = q_block * BLOCK_Q + rows // GROUP_PAD  # query token within the request
    head = kv_head * GROUP + rows % GROUP_PAD
    row_ok = (token < q_len) & (rows % GROUP_PAD < GROUP)
    dims = tl.arange(0, HEAD_DIM_PAD)
    dim_ok = dims < HEAD_DIM
    q_rows = (q_start + token).to(tl.int64) * q_stride_t + head * q_stride_h
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=row_ok[:, None] & dim_ok[None, :], other=0.0)

    m_i = tl.full([BLOCK_Q * GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_Q * GROUP_PAD], tl.float32)
    acc = tl.zeros([BLOCK_Q * GROUP_PAD, HEAD_DIM_PAD], tl.float32)
    query_pos = context + token  # a query sees keys at positions <= its own
    last_key = tl.minimum(seqlen_k, context + (q_block + 1) * BLOCK_Q)  # exclusive bound for this program
    for start in range(0, last_key, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        key_ok = keys < last_key
        page = tl.load(block_table_ptr + request * block_table_stride + keys // block_size, mask=key_ok, other=0)
        kv_rows = page.to(tl.int64) * cache_stride_b + (keys % block_size) * cache_stride_s + kv_head * cache_stride_h
        kv_mask = key_ok[:, None] & dim_ok[None, :]
        k = tl.load(k_cache_ptr + kv_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_cache_ptr + kv_rows[:, None] + dims[None, :], mask=kv_mask, other=0.0)
        if IEEE:
            s = tl.dot(q, tl.trans(k), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        visible = key_ok[None, :] & (keys[None, :] <= query_pos[:, None]) & row_ok[:, None]
        s = tl.where(visible, s * scale_log2, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_new = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing visible yet stay at zero
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        if IEEE:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m_i = m_new
    acc = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
    out_rows = (q_start + token).to(tl.int64) * out_stride_t + head * out_stride_h
    tl.store(
        out_ptr + out_rows[:, None] + dims[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & dim_ok[None, :],
    )


def paged_attention(
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
) -> torch.Tensor:
    """One launch for decodes and prefill chunks together; see reference.paged_attention_ref."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    group_pad = triton.next_power_of_2(group)
    # Rows per program: 16 for decode-only batches (one query each), more when prefill chunks are present.
    rows = 16 if max_seqlen_q == 1 else (128 if q.is_cuda else 32)
    rows = max(rows, group_pad)
    block_q = rows // group_pad
    num_requests = seqused_k.shape[0]
    grid = (num_requests, triton.cdiv(max_seqlen_q, block_q), num_kv_heads)
    assert k_cache.stride() == v_cache.stride() and q.stride(2) == 1 and k_cache.stride(3) == 1
    _paged_attention_kernel[grid](
        q,
        k_cache,
        v_cache,
        out,
        cu_seqlens_q,
        seqused_k,
        block_table,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_table.stride(0),
        softmax_scale * 1.4426950408889634,
        k_cache.shape[1],
        GROUP=group,
        GROUP_PAD=group_pad,
        HEAD_DIM=head_dim,
        HEAD_DIM_PAD=max(16, triton.next_power_of_2(head_dim)),
        BLOCK_Q=block_q,
        BLOCK_N=64 if q.is_cuda else 32,
        IEEE=q.dtype == torch.float32,
    )
    return out
