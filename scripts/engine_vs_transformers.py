"""Tokens/s of the chunkbench engine against transformers, and vLLM's CPU engine, on the same model and inputs.

Prefill: one prompt of --prompt-len tokens (transformers computes the last token's logits only, as the engine
and as its own generate() do). Decode: --batch requests of 128-token prompts, then 8 steps in which all of
them decode one token each (tokens/s of the median step). fp32 everywhere. The engines take turns at the finest
grain each phase allows, so load that comes and goes hits them alike: decode steps alternate one by one (ours,
theirs, ours, ...), and each round's prefill is timed ours, theirs, ours, theirs, keeping each engine's faster
of its two (a slow moment only ever lengthens a time). Each of --repeats rounds (after a warm-up round) gives
a ratio, and the table prints the median ratio with its spread (lowest to highest round).

vLLM (when .venv-vllm exists; --no-vllm skips it) runs in its own process, an in-process `LLM` with
enforce_eager=True, dtype float32, in the vLLM tier's environment (tests/vllm/env.py: VLLM_CPU_KVCACHE_SPACE=1,
TCMalloc preloaded when installed, as vLLM's CPU guide asks) but on torch's thread count here, as the other two engines,
on the same weights saved as a Hugging Face directory, fed token ids, prefix caching off; it takes its turn after the
other two in each phase of a round, its prefill also the faster of two. Its decode step is the batch's time from its
last first token to its last token over 8, from vLLM's own request timestamps (log stats on).

    .venv/bin/python scripts/engine_vs_transformers.py --model small
    .venv/bin/python scripts/engine_vs_transformers.py --model .venv-vllm/tiny-llama --prompt-len 1024
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # tests.vllm.env: vLLM's environment as the tier runs it
VLLM_PYTHON = REPO / ".venv-vllm" / "bin" / "python"
DECODE_STEPS = 8
SHORT_PROMPT = 128


def vllm_worker(model_dir: str) -> None:
    """Runs under .venv-vllm's python: answers 'prefill' / 'decode' lines on stdin with seconds as JSON."""
    from vllm import LLM, SamplingParams, TokensPrompt

    spec = json.loads(Path(model_dir, "requests.json").read_text())
    llm = LLM(
        model=model_dir,
        skip_tokenizer_init=True,
        enforce_eager=True,
        dtype="float32",
        max_model_len=spec["max_model_len"],
        block_size=32,
        max_num_batched_tokens=max(4096, len(spec["prompt"])),
        max_num_seqs=max(256, len(spec["short"])),
        enable_prefix_caching=False,
        disable_log_stats=False,
    )  # repeated prompts are computed each time, as in the other two
    prompts = {
        "prefill": [TokensPrompt(prompt_token_ids=spec["prompt"])],
        "decode": [TokensPrompt(prompt_token_ids=row) for row in spec["short"]],
    }

    def seconds(name: str) -> float:
        """Prefill: the call's wall time. Decode: from the batch's last first token to its last token (the
        engine core's own timestamps), per step."""
        params = SamplingParams(
            max_tokens=1 if name == "prefill" else 1 + DECODE_STEPS, temperature=0.0, ignore_eos=True, detokenize=False
        )
        start = time.perf_counter()
        outputs = llm.generate(prompts[name], params, use_tqdm=False)
        if name == "prefill":
            return time.perf_counter() - start
        first = max(o.metrics.first_token_ts for o in outputs)
        return (max(o.metrics.last_token_ts for o in outputs) - first) / DECODE_STEPS

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        print(json.dumps({"seconds": seconds(line.strip())}), flush=True)


class VllmPeer:
    """The worker process; `time(name)` asks it for one measurement."""

    def __init__(self, model_dir: str) -> None:
        # as the tier runs vLLM: the engine core in this worker (nothing busy between turns), TCMalloc preloaded;
        # but on as many threads as the other two engines (the tier serves on one: tests/vllm/env.py)
        import torch

        from tests.vllm.env import vllm_env

        env = vllm_env(OMP_NUM_THREADS=str(torch.get_num_threads()))
        self.log = tempfile.NamedTemporaryFile("w+", prefix="vllm-peer-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            [str(VLLM_PYTHON), __file__, "--vllm-worker", model_dir],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.log,
            text=True,
            env=env,
        )
        self._read()  # ready

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        while line and not line.startswith("{"):  # vLLM may print to stdout too
            line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the vLLM worker exited (exit code {self.process.wait()}); see {self.log.name}")
        return json.loads(line)

    def time(self, name: str) -> float:
        self.process.stdin.write(name + "\n")
        self.process.stdin.flush()
        return self._read()["seconds"]

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait(timeout=60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="small")
    parser.add_argument("--prompt-len", type=int, default=2048)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds after one warm-up round")
    parser.add_argument("--no-vllm", action="store_true", help="skip vLLM's CPU engine even if .venv-vllm exists")
    parser.add_argument("--vllm-worker", metavar="DIR", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_worker:
        return vllm_worker(args.vllm_worker)
    run(args)


def run(args: argparse.Namespace) -> None:
    import torch
    import transformers
    from chunkbench.engine.config import EngineConfig, ModelConfig
    from chunkbench.engine.engine import LLMEngine
    from chunkbench.engine.request import SamplingParams

    torch.manual_seed(0)
    budget = max(args.prompt_len, args.batch * SHORT_PROMPT)  # the decode batch's prompts in one step
    engine = LLMEngine(
        EngineConfig.create(
            args.model,
            policy="chunked",
            max_num_batched_tokens=budget,
            max_num_seqs=max(256, args.batch),
            max_model_len=min(4096, ModelConfig.from_name(args.model).max_model_len),
            num_blocks=2048,
            dtype="float32",
        )
    )
    vocab = engine.config.model.vocab_size
    prompt = torch.randint(0, vocab, (args.prompt_len,)).tolist()
    short = torch.randint(0, vocab, (args.batch, SHORT_PROMPT))
    model = hf_model(engine, transformers)

    def engine_prefill() -> float:
        engine.add_request(prompt, SamplingParams(max_tokens=1))
        start = time.perf_counter()
        engine.step()
        return time.perf_counter() - start

    @torch.inference_mode()
    def hf_prefill() -> float:
        start = time.perf_counter()
        model(torch.tensor([prompt]), use_cache=False, logits_to_keep=1)  # the last token's logits, as ours
        return time.perf_counter() - start

    def engine_decode():
        """Each decode step's seconds, after one step of all the prompts."""
        for row in short.tolist():
            engine.add_request(row, SamplingParams(max_tokens=1 + DECODE_STEPS))
        engine.step()  # all the prompts
        for _ in range(DECODE_STEPS):  # every request decodes in each
            start = time.perf_counter()
            engine.step()
            yield time.perf_counter() - start
        assert not engine.has_unfinished()

    @torch.inference_mode()
    def hf_forward(tokens, cache=None):
        out = model(tokens, past_key_values=cache, use_cache=True, logits_to_keep=1)
        return out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)

    def hf_decode():
        cache, token = hf_forward(short)
        for _ in range(DECODE_STEPS):
            start = time.perf_counter()
            cache, token = hf_forward(token, cache)
            yield time.perf_counter() - start

    def prefill_round() -> dict[str, float]:
        """Each engine's faster of two prefills, taken in turn (ours, theirs, ours, theirs)."""
        ours, hf = zip(*[(engine_prefill(), hf_prefill()) for _ in range(2)])
        return {"ours": min(ours), "hf": min(hf)}

    def decode_round() -> dict[str, float]:
        """The median step of each, the two engines' steps taken in turn (zip runs them alternately)."""
        ours, hf = zip(*zip(engine_decode(), hf_decode()))
        return {"ours": statistics.median(ours), "hf": statistics.median(hf)}

    peer = start_vllm(args, model, prompt, short.tolist(), engine.config.scheduler.max_model_len)
    phases = {"prefill": (args.prompt_len, prefill_round), "decode": (args.batch, decode_round)}
    seconds: dict[tuple[str, str], list[float]] = {(p, e): [] for p in phases for e in ("ours", "hf", "vllm")}
    try:
        for round_ in range(args.repeats + 1):  # round 0 warms up
            for phase, (_, measure) in phases.items():
                times = measure()
                if peer:  # its prefill, too, the faster of two (its decode is one batch, timed by step)
                    times["vllm"] = min(peer.time(phase) for _ in range(2 if phase == "prefill" else 1))
                if round_:
                    for name, value in times.items():
                        seconds[(phase, name)].append(value)
    finally:
        if peer:
            peer.close()
    print_table(args, torch.__version__, torch.get_num_threads(), phases, seconds)


def hf_model(engine, transformers):
    m = engine.config.model
    config = transformers.LlamaConfig(
        vocab_size=m.vocab_size,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        max_position_embeddings=m.max_model_len,
        rope_theta=m.rope_theta,
        rms_norm_eps=m.rms_norm_eps,
        tie_word_embeddings=m.tie_word_embeddings,
        attention_bias=m.qkv_bias,
    )
    model = transformers.LlamaForCausalLM(config).eval()
    missing, _ = model.load_state_dict(engine.executor.model.state_dict(), strict=False)  # the same weights
    missing = [k for k in missing if k != "lm_head.weight" or not m.tie_word_embeddings]
    if missing:
        raise SystemExit(f"transformers' model has weights the engine's lacks: {missing[:3]}")
    return model


def start_vllm(args, model, prompt: list[int], short: list[list[int]], max_model_len: int) -> VllmPeer | None:
    if args.no_vllm or not VLLM_PYTHON.exists():
        return None
    folder = tempfile.mkdtemp(prefix="engine-vs-vllm-")
    model.save_pretrained(folder)  # the same weights, as a Hugging Face directory
    Path(folder, "requests.json").write_text(
        json.dumps({"prompt": prompt, "short": short, "max_model_len": max_model_len})
    )
    return VllmPeer(folder)


def print_table(args, torch_version: str, threads: int, phases, seconds) -> None:
    have_vllm = bool(seconds[("prefill", "vllm")])
    print(
        f"model {args.model}, fp32, torch {torch_version}, {threads} threads; {args.repeats} interleaved rounds"
        f" after a warm-up; medians, spread = lowest-highest round"
        + ("; vLLM 0.32 CPU, float32, eager" if have_vllm else "")
    )
    head = "| phase | chunkbench tokens/s | transformers tokens/s | ratio (spread) |"
    print(head + (" vLLM CPU tokens/s | ratio to vLLM (spread) |" if have_vllm else ""))
    print("|---" * (6 if have_vllm else 4) + "|")
    for phase, (tokens, _) in phases.items():
        ours, hf, vllm = (seconds[(phase, name)] for name in ("ours", "hf", "vllm"))
        label = f"prefill ({args.prompt_len}-token prompt)" if phase == "prefill" else f"decode (batch {args.batch})"
        cells = [
            label,
            f"{tokens / statistics.median(ours):,.0f}",
            f"{tokens / statistics.median(hf):,.0f}",
            ratio_cell(hf, ours),
        ]
        if have_vllm:
            cells += [f"{tokens / statistics.median(vllm):,.0f}", ratio_cell(vllm, ours)]
        print("| " + " | ".join(cells) + " |")
    for phase in phases:  # in round order, so a slow round can be told from a drifting machine
        ours = seconds[(phase, "ours")]
        rounds = ", ".join(f"{o * 1e3:.0f}/{h * 1e3:.0f} ms" for o, h in zip(ours, seconds[(phase, "hf")]))
        print(f"{phase} rounds, chunkbench/transformers: {rounds}")


def ratio_cell(theirs: list[float], ours: list[float]) -> str:
    """Speed of ours over theirs: the median of the per-round ratios and their range."""
    ratios = sorted(t / o for t, o in zip(theirs, ours))
    return f"{statistics.median(ratios):.2f}x ({ratios[0]:.2f}-{ratios[-1]:.2f})"


if __name__ == "__main__":
    main()
