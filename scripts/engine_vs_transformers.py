"""Tokens/s of the chunkbench engine against transformers on the same model, weights and inputs.

Prefill: one prompt of --prompt-len tokens. Decode: --batch requests of 128-token prompts, one token each
per step. Median over --repeats after a warm-up; fp32.

    .venv/bin/python scripts/engine_vs_transformers.py --model small
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import transformers

from chunkbench.engine.config import EngineConfig
from chunkbench.engine.engine import LLMEngine
from chunkbench.engine.request import SamplingParams


def hf_model(engine: LLMEngine) -> transformers.LlamaForCausalLM:
    m = engine.config.model
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers, num_attention_heads=m.num_heads, num_key_value_heads=m.num_kv_heads,
        head_dim=m.head_dim, max_position_embeddings=m.max_model_len, rope_theta=m.rope_theta,
        rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=m.tie_word_embeddings, attention_bias=m.qkv_bias)
    model = transformers.LlamaForCausalLM(config).eval()
    model.load_state_dict(engine.executor.model.state_dict(), strict=False)  # the very same weights
    return model


def timed(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    engine = LLMEngine(EngineConfig.create(args.model, policy="chunked", max_num_batched_tokens=args.prompt_len,
                                           max_model_len=4096, num_blocks=2048, dtype="float32"))
    vocab = engine.config.model.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_len,)).tolist()
    short = torch.randint(0, vocab, (args.batch, 128))

    def engine_prefill():
        engine.add_request(prompt, SamplingParams(max_tokens=1))
        engine.step()

    decode_steps = []

    def engine_decode():
        for row in short.tolist():
            engine.add_request(row, SamplingParams(max_tokens=9))
        engine.step()  # the prompts
        for _ in range(8):
            start = time.perf_counter()
            engine.step()
            decode_steps.append(time.perf_counter() - start)

    model = hf_model(engine)

    @torch.inference_mode()
    def hf_prefill():
        model(torch.tensor([prompt]), use_cache=False)

    hf_steps = []

    @torch.inference_mode()
    def hf_decode():
        out = model(short, use_cache=True)
        cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        for _ in range(8):
            start = time.perf_counter()
            out = model(token, past_key_values=cache, use_cache=True)
            cache, token = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
            hf_steps.append(time.perf_counter() - start)

    rows = []
    for name, fn, steps, tokens in [("prefill", engine_prefill, None, args.prompt_len),
                                    ("decode", engine_decode, decode_steps, args.batch)]:
        hf_fn, hf_list = (hf_prefill, None) if name == "prefill" else (hf_decode, hf_steps)
        ours = timed(fn, args.repeats)
        theirs = timed(hf_fn, args.repeats)
        if steps is not None:
            ours, theirs = statistics.median(steps), statistics.median(hf_list)
        rows.append((name, tokens / ours, tokens / theirs))
    print(f"model {args.model}, fp32, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("| phase | chunkbench tokens/s | transformers tokens/s | ratio |")
    print("|---|---|---|---|")
    for name, ours, theirs in rows:
        label = f"prefill ({args.prompt_len}-token prompt)" if name == "prefill" else f"decode (batch {args.batch})"
        print(f"| {label} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")


if __name__ == "__main__":
    main()
