"""A checkpoint saved by transformers loads through `--model <dir>` and reproduces transformers' outputs."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from chunkbench.engine.config import EngineConfig, ModelConfig  # noqa: E402
from chunkbench.engine.engine import LLMEngine  # noqa: E402
from chunkbench.engine.request import SamplingParams  # noqa: E402

PROMPT_LENS = [1, 7, 16, 45, 130]


def save_tiny_llama(path, **overrides):
    config = transformers.LlamaConfig(
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        **overrides,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():  # HF's init N(0, 0.02) gives near-flat logits; unit-variance layers give clear winners
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
    model.save_pretrained(path, safe_serialization=True)
    return model


@pytest.mark.parametrize(
    "rope_scaling",
    [
        None,
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        },
    ],
)
def test_greedy_tokens_and_logits_match_transformers(tmp_path, rope_scaling):
    overrides = {"rope_scaling": rope_scaling} if rope_scaling else {}
    hf = save_tiny_llama(tmp_path, **overrides)
    config = ModelConfig.from_hf_dir(tmp_path)
    assert config.rope_scaling == ((8.0, 1.0, 4.0, 64) if rope_scaling else None)
    engine = LLMEngine(EngineConfig.create(str(tmp_path), policy="chunked", max_num_batched_tokens=16, num_blocks=128))
    engine.executor.keep_logits = True
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    requests = [engine.add_request(p, SamplingParams(max_tokens=32, ignore_eos=True)) for p in prompts]
    first_logits = {}
    while engine.has_unfinished():
        engine.step()
        for rid, logits in engine.executor.last_logits.items():
            first_logits.setdefault(rid, logits)
    for prompt, request in zip(prompts, requests):
        ids = torch.tensor([prompt])
        with torch.no_grad():
            want_logits = hf(ids).logits[0, -1]
            want = hf.generate(ids, max_new_tokens=32, do_sample=False, min_new_tokens=32, pad_token_id=0)[
                0, len(prompt) :
            ].tolist()
        assert request.output_token_ids == want, f"prompt of {len(prompt)} tokens"
        torch.testing.assert_close(first_logits[request.request_id], want_logits, atol=1e-4, rtol=0)


def test_hf_config_fields_are_read(tmp_path):
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen2",
                "vocab_size": 100,
                "hidden_size": 64,
                "intermediate_size": 128,
                "num_hidden_layers": 2,
                "num_attention_heads": 4,
                "num_key_value_heads": 1,
                "max_position_embeddings": 256,
                "rope_theta": 1e6,
                "rms_norm_eps": 1e-6,
                "eos_token_id": [5, 6],
            }
        )
    )
    config = ModelConfig.from_hf_dir(tmp_path)
    assert (config.qkv_bias, config.num_kv_heads, config.head_dim, config.eos_token_id) == (True, 1, 16, 5)
    assert (config.rope_theta, config.max_model_len, config.rms_norm_eps) == (1e6, 256, 1e-6)
