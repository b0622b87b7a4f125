"""How a model splits over N GPUs under tensor parallelism (Megatron-LM's scheme, as vLLM and SGLang run it).

Column-parallel q/k/v and gate/up projections and row-parallel o/down projections give each GPU 1/N of the
attention heads and of the MLP's intermediate width; the embedding and LM head are split over the vocabulary
(vLLM's VocabParallelEmbedding / ParallelLMHead). Each layer ends its attention and its MLP with an
all-reduce of the hidden states. KV heads split too, but never below one per GPU: with N > num_kv_heads
each KV head is replicated on N / num_kv_heads GPUs (vLLM's QKVParallelLinear). No torch here.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from chunkbench.errors import ConfigError

from .model_config import ModelConfig

if TYPE_CHECKING:  # annotations only: config.py imports this module
    from .config import EngineConfig

ALL_REDUCES_PER_LAYER = 2  # after the attention's o_proj and after the MLP's down_proj


def check_tensor_parallel(model: ModelConfig, tp: int) -> None:
    """vLLM's divisibility rules: heads split evenly, and KV heads either split evenly or replicate evenly."""
    if tp < 1:
        raise ConfigError(f"--tensor-parallel-size must be >= 1, got {tp}")
    if model.num_heads % tp:
        raise ConfigError(f"--tensor-parallel-size {tp} must divide {model.name}'s {model.num_heads} attention heads")
    kv = model.num_kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        raise ConfigError(f"--tensor-parallel-size {tp} must divide, or be a multiple of, {model.name}'s {kv} KV heads")


def kv_heads_per_gpu(model: ModelConfig, tp: int) -> int:
    return max(1, model.num_kv_heads // tp)


def heads_per_gpu(model: ModelConfig, tp: int) -> int:
    return model.num_heads // tp


def intermediate_per_gpu(model: ModelConfig, tp: int) -> int:
    return math.ceil(model.intermediate_size / tp)


def linear_params_per_gpu(model: ModelConfig, tp: int) -> int:
    """The decoder layers' matrix weights one GPU holds (ModelConfig.num_linear_params at tp=1)."""
    if tp == 1:
        return model.num_linear_params
    h, d = model.hidden_size, model.head_dim
    q, kv = heads_per_gpu(model, tp) * d, kv_heads_per_gpu(model, tp) * d
    return model.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * intermediate_per_gpu(model, tp))


def params_per_gpu(model: ModelConfig, tp: int) -> int:
    """Weights one GPU holds: its linear shard, its vocabulary shard of the embedding and LM head, and the
    norms and biases kept whole (biases do split, but are < 0.01% of the weights)."""
    h = model.hidden_size
    embeddings = model.vocab_size * h * (1 if model.tie_word_embeddings else 2)
    replicated = model.num_params - model.num_linear_params - embeddings
    return linear_params_per_gpu(model, tp) + math.ceil(embeddings / tp) + replicated


def kv_bytes_per_token_per_gpu(model: ModelConfig, tp: int, kv_dtype_bytes: int) -> int:
    """K and V of one token over every layer, as one GPU stores them."""
    return 2 * model.num_layers * kv_heads_per_gpu(model, tp) * model.head_dim * kv_dtype_bytes


def single_device_limitation(config: EngineConfig) -> str | None:
    """Why the real engine cannot run `config` (None: it can): it runs on one device, with a cache in the
    model's dtype. The simulator models both."""
    if config.tensor_parallel_size > 1:
        return (
            f"--tensor-parallel-size {config.tensor_parallel_size} needs the simulator (--backend sim): "
            "the real engine runs on one device"
        )
    if config.cache.kv_cache_dtype != "auto":
        return (
            f"--kv-cache-dtype {config.cache.kv_cache_dtype} needs the simulator (--backend sim): the real "
            "engine caches K/V in the model's dtype"
        )
    return None
