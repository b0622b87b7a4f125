"""Peak activation memory of one step, from its shapes: the one formula the simulator, the CPU engine and
the simulated KV-cache sizing share (measured instead on CUDA: see engine/executor.py). No torch here.

A step's tokens go through every layer as one [n, hidden] batch, one layer at a time, so the peak is what
one layer holds at once plus what lives for the whole step (docs/architecture.md, 'Activation memory'; the
formula term by term: step_activation_bytes).
"""

from __future__ import annotations

from .config import ModelConfig
from .sharding import heads_per_gpu, intermediate_per_gpu, kv_heads_per_gpu

QUERY_BLOCK = 1024  # kernels/reference.py's rows per softmax (copied: kernels imports torch)
ATTENTION_PATHS = ("flash", "reference", "math")
FP32 = 4


def step_activation_bytes(
    model: ModelConfig,
    prefills,
    decodes,
    num_sampled: int,
    act_bytes: int,
    tp: int = 1,
    attention: str = "flash",
    decode_attention: str | None = None,
) -> int:
    """Peak bytes one GPU allocates for a step's activations. `prefills`: (chunk tokens, cached context)
    pairs; `decodes`: each decode's keys (context length). `decode_attention`: the decodes' path when it is
    not `attention`'s (the CPU engine's fp32 decodes: kernels/cpu_decode.c reads the pages in place,
    "flash"):

      step     n * (RoPE tables: 3 * head_dim/2 + 1 fp32 values, and three int64 index rows)
      + max of the layer's phases (per GPU under tensor parallelism, `act` bytes per value):
        mlp        3 [n, hidden]  (the layer's input, still held by the caller; the residual; the normalised input)
                 + 3 [n, intermediate/N]  (gate after SiLU, up, and their product; vLLM's fused gate_up + act is
                                           the same three widths)
        attention  2 [n, hidden] + 3 [n, heads/N * head_dim] (q, the kernel's output, o_proj's input)
                 + 2 [n, kv_heads/N * head_dim] (k, v)
                 + per-path buffers of the one chunk being attended (chunks are attended one after another):
                   flash      nothing: FlashAttention-style kernels (the Triton path, vLLM, SGLang) tile the
                              scores in on-chip memory, so no [queries, keys] tensor ever exists
                   reference  this engine's torch path (kernels/reference.py): fp32 copies of the chunk's K and V
                              gathered from the pages, and, for chunks with cached context or longer than
                              QUERY_BLOCK, the bool mask [rows, keys] plus the float copy SDPA makes of it. With
                              torch >= 2.3 CPU SDPA runs a tiled (flash) kernel even with a mask, so the scores
                              themselves are not materialised (measured: tests/sim/test_deployments.py). Its fp32
                              decodes gather nothing where kernels/cpu_decode.c is built:
                              `decode_attention="flash"`
                   math       a naive softmax(QK^T)V (Hugging Face's "eager" attention): the scores and the
                              probabilities, [heads/N, rows, keys] fp32 each
        logits     [n, hidden] + [sampled, vocab] fp32 (gathered over the GPUs) + [sampled, vocab/N] in `act`
    """
    n = sum(q for q, _ in prefills) + len(decodes) if prefills else len(decodes)  # most steps only decode
    if n == 0:
        return 0
    h, d = model.hidden_size, model.head_dim
    q_width, kv_width = heads_per_gpu(model, tp) * d, kv_heads_per_gpu(model, tp) * d
    step = n * (FP32 * (3 * d // 2 + 1) + 3 * 8)
    mlp = (3 * n * h + 3 * n * intermediate_per_gpu(model, tp)) * act_bytes
    chunks = (
        max(chunk_attention_bytes(model, q, ctx, act_bytes, tp, attention) for q, ctx in prefills) if prefills else 0
    )
    attention_bytes = (
        (2 * n * h + 3 * n * q_width + 2 * n * kv_width) * act_bytes
        + chunks
        + decode_attention_bytes(model, decodes, tp, decode_attention or attention)
    )
    logits = (
        n * h * act_bytes
        + num_sampled * model.vocab_size * FP32
        + (num_sampled * -(-model.vocab_size // tp) * act_bytes if act_bytes != FP32 or tp > 1 else 0)
    )
    return step + max(mlp, attention_bytes, logits)


def chunk_attention_bytes(
    model: ModelConfig, q: int, ctx: int, act_bytes: int, tp: int = 1, attention: str = "flash"
) -> int:
    """What attending one prefill chunk of `q` queries over `ctx` cached keys allocates besides q, k, v."""
    keys, rows = q + ctx, min(q, QUERY_BLOCK)
    if attention == "flash":
        return 0
    if attention == "math":
        return 2 * heads_per_gpu(model, tp) * q * keys * FP32  # scores and probabilities, the whole chunk
    gathered = 2 * keys * model.kv_size * FP32  # the reference path runs on one device: every KV head
    upcast = 2 * rows * model.q_size * FP32 if act_bytes != FP32 else 0  # fp32 queries and output
    masked = ctx > 0 or q > QUERY_BLOCK  # else plain causal SDPA, no mask
    return gathered + upcast + (rows * keys * (1 + FP32) if masked else 0)


def decode_attention_bytes(model: ModelConfig, decodes, tp: int = 1, attention: str = "flash") -> int:
    """The reference path pads decodes in buckets of similar length and attends one bucket at a time: the
    largest bucket's gathered K/V and mask. Flash kernels read the pages in place."""
    if attention == "flash" or not decodes:
        return 0
    if attention == "math":
        return 2 * heads_per_gpu(model, tp) * sum(decodes) * FP32
    from chunkbench.kernels.buckets import length_buckets  # torch-free

    lengths = list(decodes)
    groups = length_buckets(sorted(range(len(lengths)), key=lengths.__getitem__), lengths)
    return max(len(g) * lengths[g[-1]] * (2 * model.kv_size * FP32 + 1 + FP32) for g in groups)
