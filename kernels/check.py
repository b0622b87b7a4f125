"""Correctness cases for the Triton kernels against the torch reference, on any device.

Used by the tests and by `chunkbench kernels check`. Each case builds a random batch over a NaN-poisoned
paged cache with shuffled pages, so a kernel that reads a slot it should not, or writes outside the batch,
fails loudly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

BLOCK_SIZE = 16
TOLERANCE = {
    torch.float32: dict(atol=2e-4, rtol=1e-4),
    torch.float16: dict(atol=1.5e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=3e-2, rtol=2e-2),
}

# (query tokens, keys in total) per request: pure prefills, chunks over cached context, decodes.
PREFILLS = [(37, 37), (130, 130)]
CHUNKS = [(5, 18), (129, 463)]
DECODES = [(1, 1), (1, 37), (1, 1328)]
MIXED = [(1, 37), (5, 18), (37, 37), (1, 1328), (129, 463), (1, 1), (17, 17), (0, 9)]  # (0, 9): no query
BATCHES = {"prefill": PREFILLS, "chunks": CHUNKS, "decodes": DECODES, "mixed": MIXED}
HEAD_LAYOUTS = [(4, 4), (8, 2), (10, 2), (8, 1)]  # GQA groups 1, 4, 5 and MQA
HEAD_DIMS = [64, 128, 80]


@dataclass
class Batch:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seqused_k: torch.Tensor
    block_table: torch.Tensor
    max_seqlen_q: int
    max_seqlen_k: int

    def attend(self, fn, out: torch.Tensor, scale: float) -> torch.Tensor:
        return fn(
            self.q,
            self.k_cache,
            self.v_cache,
            out,
            self.cu_seqlens_q,
            self.seqused_k,
            self.block_table,
            self.max_seqlen_q,
            self.max_seqlen_k,
            scale,
        )


def make_batch(
    shape: list[tuple[int, int]],
    num_heads: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype,
    device: str,
    seed: int = 0,
) -> Batch:
    """A random batch; only the cache slots in use hold numbers, the rest (and padding pages) are NaN."""
    gen = torch.Generator().manual_seed(seed)
    pages = [-(-k // BLOCK_SIZE) for _, k in shape]
    num_blocks = sum(pages) + 3
    order = torch.randperm(num_blocks, generator=gen)
    k_cache = torch.full((num_blocks, BLOCK_SIZE, num_kv_heads, head_dim), float("nan"))
    v_cache = k_cache.clone()
    block_table = torch.full((len(shape), max(pages) + 2), int(order[-1]), dtype=torch.int32)  # padding: NaN page
    used = 0
    for i, (_, seqlen_k) in enumerate(shape):
        ids = order[used : used + pages[i]]
        used += pages[i]
        block_table[i, : pages[i]] = ids.to(torch.int32)
        slots = torch.arange(seqlen_k)
        k_cache[ids[slots // BLOCK_SIZE], slots % BLOCK_SIZE] = torch.randn(
            seqlen_k, num_kv_heads, head_dim, generator=gen
        )
        v_cache[ids[slots // BLOCK_SIZE], slots % BLOCK_SIZE] = torch.randn(
            seqlen_k, num_kv_heads, head_dim, generator=gen
        )
    cu = torch.tensor([0] + [q for q, _ in shape]).cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), num_heads, head_dim, generator=gen)
    seqused_k = torch.tensor([k for _, k in shape], dtype=torch.int32)
    return Batch(
        q.to(device, dtype),
        k_cache.to(device, dtype),
        v_cache.to(device, dtype),
        cu.to(device),
        seqused_k.to(device),
        block_table.to(device),
        max(q for q, _ in shape),
        max(k for _, k in shape),
    )


def compare_to_reference(
    shape: list[tuple[int, int]],
    num_heads: int = 8,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    dtype: torch.dtype = torch.float32,
    device: str = "cpu",
) -> float:
    """Run the Triton kernel and the reference on one batch; raise on a mismatch, NaN or stray write.
    Returns the largest absolute difference."""
    from chunkbench.kernels.reference import paged_attention_ref
    from chunkbench.kernels.triton_attention import paged_attention

    batch = make_batch(shape, num_heads, num_kv_heads, head_dim, dtype, device)
    sentinel = 7.0  # one spare output row past the batch: must stay untouched
    outs = []
    for fn in (paged_attention_ref, paged_attention):
        out = torch.full((batch.q.shape[0] + 1, num_heads, head_dim), sentinel, dtype=dtype, device=device)
        outs.append(batch.attend(fn, out, head_dim**-0.5))
    ref, tri = outs
    if tri[:-1].isnan().any() or ref[:-1].isnan().any():
        raise AssertionError("NaN in the output: a padded or unwritten slot was read")
    if not (tri[-1] == sentinel).all():
        raise AssertionError("the kernel wrote outside the batch")
    torch.testing.assert_close(tri.float(), ref.float(), **TOLERANCE[dtype])
    return float((tri.float() - ref.float()).abs().max())


def standard_cases(dtypes: list[torch.dtype]) -> list[tuple[str, dict]]:
    """The named cases `chunkbench kernels check` runs: every batch kind per dtype, every head layout."""
    cases = [
        (f"{name} {str(dtype).removeprefix('torch.')}", dict(shape=shape, dtype=dtype))
        for dtype in dtypes
        for name, shape in BATCHES.items()
    ]
    cases += [
        (
            f"heads {h}/{kv} dim {d}",
            dict(shape=[(1, 37), (5, 18), (33, 33), (1, 300)], num_heads=h, num_kv_heads=kv, head_dim=d),
        )
        for h, kv in HEAD_LAYOUTS
        for d in HEAD_DIMS
    ]
    return cases
