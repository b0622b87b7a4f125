"""Triton kernels against the torch reference (interpreter on CPU, compiled on CUDA), and the reference
against a naive einsum."""

import pytest
import torch
from chunkbench.kernels.check import (
    BATCHES,
    BLOCK_SIZE,
    CHUNKS,
    HEAD_DIMS,
    HEAD_LAYOUTS,
    compare_to_reference,
    make_batch,
)
from chunkbench.kernels.reference import paged_attention_ref, write_kv_ref
from chunkbench.kernels.triton_attention import paged_attention, write_kv

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("name, shape", BATCHES.items())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_batch_kinds(name, shape, dtype):
    compare_to_reference(shape, dtype=dtype, device=DEVICE)


@pytest.mark.parametrize("num_heads, num_kv_heads", HEAD_LAYOUTS)
@pytest.mark.parametrize("head_dim", HEAD_DIMS)
def test_gqa_groups_and_head_dims(num_heads, num_kv_heads, head_dim):
    compare_to_reference([(1, 37), (5, 18), (33, 33), (1, 300)], num_heads, num_kv_heads, head_dim, device=DEVICE)


def test_a_wrong_kernel_is_caught(monkeypatch):
    """The check can fail: a kernel that drops the causal mask's last key disagrees with the reference."""
    import chunkbench.kernels.triton_attention as tri

    def off_by_one(q, k_cache, v_cache, out, cu, seqused_k, *rest):
        return paged_attention(q, k_cache, v_cache, out, cu, seqused_k - 1, *rest)

    monkeypatch.setattr(tri, "paged_attention", off_by_one)
    with pytest.raises(AssertionError):
        compare_to_reference(CHUNKS, device=DEVICE)


def test_reference_matches_naive_attention():
    shape = [(1, 37), (5, 18), (20, 20)]
    batch = make_batch(shape, 8, 2, 32, torch.float32, "cpu")
    q, k_cache, v_cache, cu, table = batch.q, batch.k_cache, batch.v_cache, batch.cu_seqlens_q, batch.block_table
    out = batch.attend(paged_attention_ref, torch.empty_like(q), 0.3)
    for i, (q_len, k_len) in enumerate(shape):
        pos = torch.arange(k_len)
        k = torch.stack([k_cache[table[i, p // BLOCK_SIZE], p % BLOCK_SIZE] for p in pos]).repeat_interleave(4, 1)
        v = torch.stack([v_cache[table[i, p // BLOCK_SIZE], p % BLOCK_SIZE] for p in pos]).repeat_interleave(4, 1)
        qi = q[cu[i] : cu[i + 1]]
        scores = torch.einsum("qhd,khd->hqk", qi, k) * 0.3
        visible = pos[None, :] <= (k_len - q_len + torch.arange(q_len))[:, None]
        weights = scores.masked_fill(~visible, float("-inf")).softmax(-1)
        torch.testing.assert_close(
            out[cu[i] : cu[i + 1]], torch.einsum("hqk,khd->qhd", weights, v), atol=1e-5, rtol=1e-5
        )


@pytest.mark.parametrize("num_kv_heads, head_dim", [(2, 64), (3, 80), (1, 128)])
def test_write_kv_matches_a_python_scatter(num_kv_heads, head_dim):
    gen = torch.Generator().manual_seed(1)
    num_tokens, q_size = 9, 4 * head_dim
    row = num_kv_heads * head_dim
    qkv = torch.randn(num_tokens, q_size + 2 * row, generator=gen).to(DEVICE)
    key = qkv[:, q_size : q_size + row].view(num_tokens, num_kv_heads, head_dim)  # strided views, as in a model
    value = qkv[:, q_size + row :].view(num_tokens, num_kv_heads, head_dim)
    slots = torch.tensor([5, 17, -1, 0, 63, 32, -1, 40, 1], device=DEVICE)
    caches = {}
    for name, fn in (("triton", write_kv), ("ref", write_kv_ref)):
        k_cache = torch.zeros(4, BLOCK_SIZE, num_kv_heads, head_dim, device=DEVICE)
        v_cache = torch.zeros_like(k_cache)
        fn(key, value, k_cache, v_cache, slots)
        caches[name] = (k_cache, v_cache)
    k_expected = torch.zeros(4 * BLOCK_SIZE, num_kv_heads, head_dim, device=DEVICE)
    v_expected = torch.zeros_like(k_expected)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            k_expected[slot], v_expected[slot] = key[t], value[t]
    for name, (k_cache, v_cache) in caches.items():
        assert torch.equal(k_cache.view_as(k_expected), k_expected), name
        assert torch.equal(v_cache.view_as(v_expected), v_expected), name


@pytest.mark.cuda
@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="bf16 needs CUDA: the Triton interpreter computes garbage for bf16"
)
@pytest.mark.parametrize("name, shape", BATCHES.items())
def test_bf16_on_cuda(name, shape):
    compare_to_reference(shape, num_heads=32, num_kv_heads=8, head_dim=128, dtype=torch.bfloat16, device="cuda")


def test_engine_with_triton_backend_gives_the_torch_tokens():
    from chunkbench import LLM

    prompts = [[(7 * i + 3 * j) % 4096 for j in range(n)] for i, n in enumerate([5, 40, 70])]
    outputs = {}
    for backend in ("torch", "triton"):
        llm = LLM(
            "tiny",
            policy="chunked",
            max_num_batched_tokens=32,
            num_blocks=64,
            attention_backend=backend,
            dtype="float32",
        )
        outputs[backend] = llm.generate(prompts, max_tokens=8)
    assert outputs["triton"] == outputs["torch"]
