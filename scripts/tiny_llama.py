"""Write a tiny random-weight Llama with a trained byte-level BPE tokenizer to a Hugging Face directory.

The vLLM tier's model (scripts/vllm_env.sh): vLLM's CPU build and `chunkbench serve` load the same weights and
tokenizer from it, so their tokens can be compared. Nothing is downloaded: the tokenizer is trained here with
`tokenizers` on generated English-like text; the weights are seeded (unit-variance layers, so greedy decoding
has clear winners). Shapes suit vLLM's CPU attention (head size 64). Deterministic: the same files every run.

    python scripts/tiny_llama.py DIR [--no-chat-template]
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

VOCAB_SIZE = 4096
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
WORDS = (
    "the of and to in is was for on that with as by at from it his an were are which this be or had not "
    "but first one their its new after who they have her she two been other when there all during into "
    "school time may years more most only over city some world would where later up such used many can "
    "state about national out known university united then made hello world model token prefill chunk "
    "budget decode request server batch cache block step latency throughput schedule engine"
).split()


def corpus(n_lines: int = 4000, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(
            rng.choice(WORDS) + (str(rng.randrange(100)) if rng.random() < 0.1 else "")
            for _ in range(rng.randrange(4, 30))
        )
        for _ in range(n_lines)
    ]


def write(path: Path, chat_template: bool = True) -> Path:
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"]
    tok.train_from_iterator(
        corpus(),
        trainers.BpeTrainer(
            vocab_size=VOCAB_SIZE,
            special_tokens=specials,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        ),
    )
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(path)

    config = transformers.LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="float32",
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
    model.save_pretrained(path, safe_serialization=True)
    (path / "chunkbench-tiny.json").write_text(json.dumps({"vocab_size": tok.get_vocab_size()}))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--no-chat-template", action="store_true", help="leave the tokenizer without one")
    args = parser.parse_args()
    print(write(args.dir, chat_template=not args.no_chat_template))


if __name__ == "__main__":
    main()
