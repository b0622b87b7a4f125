"""The vocabulary random token-id prompts draw from, so that no request carries an id the server rejects.

In order: --vocab-size; the local tokenizer (--tokenizer); the server's model card when it says (chunkbench
serve reports vocab_size; vLLM's /v1/models does not, and its completions fail with "Token id N is out of
vocabulary"); vLLM's /detokenize, searched for the first id that decodes to nothing. Else the user is asked
for --vocab-size before any request is sent.
"""

from __future__ import annotations

import httpx

from chunkbench import web
from chunkbench.errors import UserError

MAX_PROBED_VOCAB = 1 << 24  # larger than any tokenizer's: a server that accepts this id bounds nothing


def tokenizer_vocab_size(path: str) -> int:
    """len(tokenizer): its base vocabulary and added tokens, the ids it can produce."""
    from chunkbench.workloads.user_files import load_tokenizer

    return len(load_tokenizer(path))


def detokenize_vocab_size(endpoint: str, model: str | None, timeout_s: float = 10.0) -> int | None:
    """A vocabulary bound from vLLM's /detokenize, or None when the server has none or bounds nothing.

    vLLM decodes any id there without checking it, and a Hugging Face tokenizer decodes an id past its
    vocabulary to "": an id that decodes to text is in the vocabulary, and so is every id below it. The largest
    power of two that decodes to text, then a bisection up to the first id that does not, gives a bound no
    larger than the tokenizer's length (an id the model has but the tokenizer lacks only lowers it: safe).
    About 2 log2(vocab) small requests, none of which runs the model."""
    url = endpoint.rstrip("/").removesuffix("/v1") + "/detokenize"

    def decodes(token_id: int) -> bool:
        try:
            response = web.post(
                url, json={"tokens": [token_id]} | ({"model": model} if model else {}), timeout=timeout_s
            )
            return response.status_code == 200 and bool(response.json().get("prompt"))
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    powers = [1 << k for k in range(4, MAX_PROBED_VOCAB.bit_length())]  # 16 ... 2^24 (small ids are often special)
    known = [p for p in powers if decodes(p)]
    if not known or known[-1] == MAX_PROBED_VOCAB:
        return None
    low, high = known[-1], 2 * known[-1]  # low decodes, high does not (the next power of two)
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if decodes(middle) else (low, middle)
    return high


def resolve_vocab_size(
    endpoint: str, model: str | None, card: dict, vocab_size: int | None, tokenizer: str | None
) -> int:
    """The vocabulary size to draw prompt ids below (module docstring's order); a UserError when unknown."""
    if vocab_size is not None:
        return vocab_size
    if tokenizer:
        return tokenizer_vocab_size(tokenizer)
    if card.get("vocab_size"):
        return int(card["vocab_size"])
    probed = detokenize_vocab_size(endpoint, model)
    if probed:
        return probed
    raise UserError(
        f"--endpoint: {endpoint} does not say its vocabulary size; pass --vocab-size N (or "
        "--tokenizer DIR) so that no prompt carries an out-of-vocabulary token id"
    )
