"""The C decode kernel (kernels/cpu_decode.c) against the torch reference it replaces on the CPU path."""

import pytest
import torch
from chunkbench.kernels import cpu_decode
from chunkbench.kernels.check import DECODES, HEAD_DIMS, HEAD_LAYOUTS, MIXED, TOLERANCE, make_batch
from chunkbench.kernels.reference import paged_attention_ref, plan_ref

pytestmark = pytest.mark.skipif(cpu_decode.library() is None, reason="no C compiler: decodes take the torch path")


def attend(batch, direct: bool) -> torch.Tensor:
    """The batch attended through a plan with or without the kernel; one sentinel row (7.0) past the batch."""
    plan = plan_ref(
        batch.cu_seqlens_q, batch.seqused_k, batch.block_table, batch.k_cache.shape[1], direct_decodes=direct
    )
    assert (plan.direct is not None) == (direct and any(batch.cu_seqlens_q.diff() == 1))
    out = torch.full((batch.q.shape[0] + 1, *batch.q.shape[1:]), 7.0)
    scale = batch.q.shape[2] ** -0.5
    return paged_attention_ref(
        batch.q,
        batch.k_cache,
        batch.v_cache,
        out,
        batch.cu_seqlens_q,
        batch.seqused_k,
        batch.block_table,
        batch.max_seqlen_q,
        batch.max_seqlen_k,
        scale,
        plan=plan,
    )


@pytest.mark.parametrize("shape", [DECODES, MIXED, [(1, k) for k in (1, 15, 16, 17, 130, 131, 700)]])
@pytest.mark.parametrize("num_heads, num_kv_heads", HEAD_LAYOUTS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_kernel_matches_the_torch_path(shape, num_heads, num_kv_heads, head_dim):
    """Unused cache pages are NaN (make_batch), so a read past a request's keys shows as NaN."""
    batch = make_batch(shape, num_heads, num_kv_heads, head_dim, torch.float32, "cpu")
    ref, ours = attend(batch, direct=False), attend(batch, direct=True)
    assert not ours[:-1].isnan().any()
    assert (ours[-1] == 7.0).all(), "the kernel wrote outside the batch"
    torch.testing.assert_close(ours, ref, **TOLERANCE[torch.float32])


def test_strided_queries_as_the_model_passes_them():
    """The model hands q as a view of the fused qkv rows (token stride > heads * head_dim)."""
    batch = make_batch(MIXED, 8, 2, 64, torch.float32, "cpu")
    ref = attend(batch, direct=False)
    wide = torch.randn(batch.q.shape[0], 12, 64)
    wide[:, :8] = batch.q
    batch.q = wide[:, :8]
    assert not batch.q.is_contiguous() and cpu_decode.usable(batch.q, batch.k_cache)
    torch.testing.assert_close(attend(batch, direct=True), ref, **TOLERANCE[torch.float32])


def test_a_wrong_length_is_caught(monkeypatch):
    """The comparison can fail: the kernel told one key too few disagrees with the reference."""
    batch = make_batch(DECODES[1:], 8, 2, 64, torch.float32, "cpu")
    ref = attend(batch, direct=False)
    real = cpu_decode.decode_attention
    monkeypatch.setattr(
        cpu_decode,
        "decode_attention",
        lambda q, kc, vc, out, rows, table, lens, scale: real(q, kc, vc, out, rows, table, lens - 1, scale),
    )
    with pytest.raises(AssertionError):
        torch.testing.assert_close(attend(batch, direct=True), ref, **TOLERANCE[torch.float32])


def test_switched_off_or_not_fp32_takes_the_torch_path(monkeypatch):
    batch = make_batch(DECODES, 8, 2, 64, torch.float32, "cpu")
    assert cpu_decode.usable(batch.q, batch.k_cache)
    assert not cpu_decode.usable(batch.q.half(), batch.k_cache.half())
    monkeypatch.setenv("CHUNKBENCH_CPU_KERNEL", "0")
    cpu_decode.library.cache_clear()
    try:
        assert cpu_decode.library() is None and not cpu_decode.usable(batch.q, batch.k_cache)
    finally:
        monkeypatch.delenv("CHUNKBENCH_CPU_KERNEL")
        cpu_decode.library.cache_clear()
