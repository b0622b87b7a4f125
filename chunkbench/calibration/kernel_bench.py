"""`chunkbench kernels bench`: throughput of the paged-attention kernel against torch SDPA (and flash-attn
when installed) on the same inputs, on CUDA. Attention shapes of llama-3-8b (32 query heads, 8 KV heads,
head dim 128), bf16.

FLOPs count only the visible (causal) query-key pairs: 4 * heads * head_dim per pair. Bytes count the K/V
read once plus the queries and outputs. Prefill rows report % of the device's dense bf16 peak, decode rows
% of its memory bandwidth. SDPA gets contiguous K/V (its best case: no page gather).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from chunkbench.sim.gpus import spec_for_device

HEADS, KV_HEADS, HEAD_DIM, BLOCK = 32, 8, 128, 16
PREFILL_SHAPES = [(chunk, ctx) for chunk in (256, 1024, 4096) for ctx in (0, 4096, 32768 - chunk)]
DECODE_SHAPES = [(batch, ctx) for batch in (1, 16, 64, 256) for ctx in (1024, 8192)]


@dataclass
class BenchRow:
    kind: str
    shape: str
    ours_ms: float
    sdpa_ms: float | None
    flash_ms: float | None
    tflops: float
    gbps: float
    pct_of_peak: float | None


def _batch(lens: list[tuple[int, int]], dtype=torch.bfloat16):
    """Random q and a paged cache holding every request's keys in shuffled pages, built on the GPU."""
    pages = [-(-k // BLOCK) for _, k in lens]
    num_blocks = sum(pages)
    k_cache = torch.randn(num_blocks, BLOCK, KV_HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    v_cache = torch.randn_like(k_cache)
    order = torch.randperm(num_blocks, device="cuda").to(torch.int32)
    table = torch.zeros(len(lens), max(pages), dtype=torch.int32, device="cuda")
    used = 0
    for i, n in enumerate(pages):
        table[i, :n] = order[used : used + n]
        used += n
    cu = torch.tensor([0] + [q for q, _ in lens], device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(int(cu[-1]), HEADS, HEAD_DIM, device="cuda", dtype=dtype)
    seqused = torch.tensor([k for _, k in lens], device="cuda", dtype=torch.int32)
    return q, k_cache, v_cache, cu, seqused, table


def _contiguous(k_cache, table, row, seqlen):
    return k_cache[table[row, : -(-seqlen // BLOCK)].long()].reshape(-1, KV_HEADS, HEAD_DIM)[:seqlen]


def run_kernel_bench() -> list[BenchRow]:
    import torch.nn.functional as F
    import triton.testing
    from torch.nn.attention.bias import causal_lower_right

    from chunkbench.kernels.triton_attention import paged_attention

    try:
        from flash_attn import flash_attn_with_kvcache
    except ImportError:
        flash_attn_with_kvcache = None
    spec = spec_for_device(torch.cuda.get_device_name())
    scale = HEAD_DIM**-0.5
    rows = []
    for kind, shapes in (("prefill", PREFILL_SHAPES), ("decode", DECODE_SHAPES)):
        for a, b in shapes:
            lens = [(a, a + b)] if kind == "prefill" else [(1, b)] * a
            q, k_cache, v_cache, cu, seqused, table = _batch(lens)
            out = torch.empty_like(q)
            max_q, max_k = max(x for x, _ in lens), max(y for _, y in lens)
            ours = triton.testing.do_bench(
                lambda: paged_attention(q, k_cache, v_cache, out, cu, seqused, table, max_q, max_k, scale)
            )
            if kind == "prefill":
                k = _contiguous(k_cache, table, 0, a + b).transpose(0, 1)[None]
                v = _contiguous(v_cache, table, 0, a + b).transpose(0, 1)[None]
                qs = q.transpose(0, 1)[None]
                mask = causal_lower_right(a, a + b)
                sdpa = triton.testing.do_bench(
                    lambda: F.scaled_dot_product_attention(qs, k, v, attn_mask=mask, enable_gqa=True)
                )
                pairs = a * b + a * (a + 1) / 2
            else:
                k = torch.stack([_contiguous(k_cache, table, i, b) for i in range(a)]).transpose(1, 2)
                v = torch.stack([_contiguous(v_cache, table, i, b) for i in range(a)]).transpose(1, 2)
                qs = q[:, :, None, :]
                sdpa = triton.testing.do_bench(lambda: F.scaled_dot_product_attention(qs, k, v, enable_gqa=True))
                pairs = a * b
            flash = None
            if flash_attn_with_kvcache is not None:
                fq = q.view(len(lens), -1, HEADS, HEAD_DIM) if kind == "decode" else q[None]
                flash = triton.testing.do_bench(
                    lambda: flash_attn_with_kvcache(
                        fq, k_cache, v_cache, cache_seqlens=seqused, block_table=table, causal=True
                    )
                )
            flops = 4 * HEADS * HEAD_DIM * pairs
            kv_bytes = 2 * sum(k for _, k in lens) * KV_HEADS * HEAD_DIM * 2 + 2 * q.numel() * 2
            tflops, gbps = flops / ours / 1e9, kv_bytes / ours / 1e6
            pct = None
            if spec is not None:
                pct = 100 * (tflops * 1e12 / spec.bf16_flops if kind == "prefill" else gbps * 1e9 / spec.mem_bandwidth)
            shape = f"chunk {a} over {b}" if kind == "prefill" else f"batch {a} x ctx {b}"
            rows.append(BenchRow(kind, shape, ours, sdpa, flash, tflops, gbps, pct))
    return rows
