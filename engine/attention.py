"""Paged attention for one step's flattened batch, and the metadata it reads.

The executor builds one `AttentionMetadata` per step and sets it with `attention_context(...)`; every
attention layer of that forward pass reads it from there, so no layer signature carries it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

import torch
from chunkbench.kernels import cpu_decode
from chunkbench.kernels.reference import AttentionPlan, paged_attention_ref, plan_ref, write_kv_ref


@dataclass
class AttentionMetadata:
    slot_mapping: torch.Tensor  # [num_tokens] cache slot of each new token
    cu_seqlens_q: torch.Tensor  # [num_reqs + 1] query offsets into the flattened batch
    seqused_k: torch.Tensor  # [num_reqs] keys each request attends to (cached + new)
    block_table: torch.Tensor  # [num_reqs, max_blocks] padded with 0
    max_seqlen_q: int
    max_seqlen_k: int
    backend: str  # "torch" or "triton"
    plan: AttentionPlan | None = None  # the torch path's gather indices, built by the step's first layer
    sampled: AttentionMetadata | None = None  # the sampled requests' last tokens alone, as one query each


_current: ContextVar[AttentionMetadata | None] = ContextVar("attention_metadata", default=None)


@contextmanager
def attention_context(metadata: AttentionMetadata):
    token = _current.set(metadata)
    try:
        yield metadata
    finally:
        _current.reset(token)


def current_metadata() -> AttentionMetadata:
    metadata = _current.get()
    if metadata is None:
        raise RuntimeError("attention called outside attention_context()")
    return metadata


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    softmax_scale: float,
    sampled_only: bool = False,
) -> torch.Tensor:
    """Write this step's K/V into the cache, then attend every query to its request's cached keys.
    `sampled_only`: `q` holds only the sampled requests' last tokens (the last layer: model.py), attended as
    `metadata.sampled` says."""
    m = current_metadata()
    triton = m.backend == "triton"
    if triton:
        from chunkbench.kernels import triton_attention as kernels
    (kernels.write_kv if triton else write_kv_ref)(k, v, k_cache, v_cache, m.slot_mapping)
    out = torch.empty_like(q)
    if sampled_only:
        sampled = m.sampled
        if sampled is None:  # nothing sampled this step: the K/V was all the last layer had to give
            return out
        m = sampled
    if triton:
        kernels.paged_attention(
            q,
            k_cache,
            v_cache,
            out,
            m.cu_seqlens_q,
            m.seqused_k,
            m.block_table,
            m.max_seqlen_q,
            m.max_seqlen_k,
            softmax_scale,
        )
        return out
    if m.plan is None:  # the same slots for every layer of the step: index them once
        m.plan = plan_ref(
            m.cu_seqlens_q, m.seqused_k, m.block_table, k_cache.shape[1], direct_decodes=cpu_decode.usable(q, k_cache)
        )  # decodes read the cache in place
    paged_attention_ref(
        q,
        k_cache,
        v_cache,
        out,
        m.cu_seqlens_q,
        m.seqused_k,
        m.block_table,
        m.max_seqlen_q,
        m.max_seqlen_k,
        softmax_scale,
        plan=m.plan,
    )
    return out
