"""The last layer runs only for the sampled tokens (engine/model.py LlamaForCausalLM.forward): their hidden
states equal the whole step's at those rows, every token's K/V is still cached, and a step that samples nothing
runs no attention in the last layer. On both attention paths (the Triton one under the interpreter here)."""

import pytest
import torch
from chunkbench.engine.attention import attention_context
from chunkbench.engine.config import EngineConfig
from chunkbench.engine.executor import ModelExecutor
from chunkbench.engine.outputs import ScheduledChunk
from chunkbench.engine.request import SamplingParams


def chunk(name: str, tokens: int, start: int, blocks: list[int], sample: bool) -> ScheduledChunk:
    return ScheduledChunk(
        name,
        [(7 * start + 13 * i + len(name)) % 4096 for i in range(tokens)],
        start,
        blocks,
        sample,
        is_decode=tokens == 1,
        sampling=SamplingParams(),
        sample_index=0,
        sample_seed=0,
    )


def forward(executor: ModelExecutor, chunks: list[ScheduledChunk], only_sampled: bool):
    """The step's hidden states (all rows, or the sampled rows only) and the last layer's K cache after it."""
    for layer in executor.model.model.layers:  # each forward from the same empty cache
        layer.self_attn.k_cache.zero_()
        layer.self_attn.v_cache.zero_()
    input_ids, positions, metadata = executor._metadata(chunks)
    rows, metadata.sampled = executor._sampled(chunks, metadata)
    with attention_context(metadata), torch.inference_mode():
        hidden = executor.model(input_ids, positions, rows if only_sampled else None)
    return hidden, rows, executor.model.model.layers[-1].self_attn.k_cache.clone()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_sampled_rows_match_the_whole_step_and_every_token_is_cached(backend):
    executor = ModelExecutor(
        EngineConfig.create("tiny", num_blocks=32, block_size=16, dtype="float32", attention_backend=backend)
    )
    step = [
        chunk("a", 40, 0, [0, 1, 2], sample=False),  # a prompt's first chunk: samples nothing
        chunk("b", 23, 0, [3, 4], sample=True),  # a whole prompt
        chunk("c", 9, 17, [5, 6], sample=True),  # a last chunk over cached context
        chunk("d", 1, 30, [7, 8], sample=True),
    ]  # a decode
    whole, rows, whole_cache = forward(executor, step, only_sampled=False)
    sampled, _, sampled_cache = forward(executor, step, only_sampled=True)
    assert rows.tolist() == [40 + 22, 40 + 23 + 8, 40 + 23 + 9]
    torch.testing.assert_close(sampled, whole[rows], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sampled_cache, whole_cache, rtol=0, atol=0)  # the same K written for every token

    nothing, rows, cache = forward(executor, step[:1], only_sampled=True)
    assert nothing.shape == (0, executor.model_config.hidden_size) and rows.numel() == 0
    assert cache[:3].abs().sum() > 0  # the chunk's keys are in the cache for its next chunk
