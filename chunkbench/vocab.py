"""The vocabulary random token-id prompts draw from, so that no request carries an id the server rejects.

In order: --vocab-size; the local tokenizer (--tokenizer); the server's model card when it says (chunkbench
serve reports vocab_size; vLLM's /v1/models does not); vLLM's /detokenize, which rejects an out-of-vocabulary
id ("Token id N is out of vocabulary"), searched for the first id it rejects. Else the user is asked for
--vocab-size before any request is sent.
"""

from __future__ import annotations

import httpx

from chunkbench.errors import UserError

MAX_PROBED_VOCAB = 1 << 24  # larger than any tokenizer's: a server that accepts this id bounds nothing


def tokenizer_vocab_size(path: str) -> int:
    """len(tokenizer): its base vocabulary and added tokens, the ids it can produce."""
    from transformers import AutoTokenizer

    try:
        return len(AutoTokenizer.from_pretrained(path))
    except (OSError, ValueError) as exc:
        raise UserError(f"--tokenizer: cannot load a tokenizer from {path}: {exc}") from None


def detokenize_vocab_size(endpoint: str, model: str | None, timeout_s: float = 10.0) -> int | None:
    """The smallest id vLLM's /detokenize rejects (every id below it is in its vocabulary), or None when the
    server has no such endpoint or rejects nothing. About 2 log2(vocab) small requests."""
    url = endpoint.rstrip("/").removesuffix("/v1") + "/detokenize"

    def accepted(token_id: int) -> bool | None:
        try:
            response = httpx.post(url, json={"tokens": [token_id]} | ({"model": model} if model else {}),
                                  timeout=timeout_s)
        except httpx.HTTPError:
            return None
        return response.status_code == 200

    if not accepted(0):
        return None
    high = 1
    while accepted(high):  # the first rejected power of two
        if high >= MAX_PROBED_VOCAB:
            return None
        high *= 2
    low = high // 2  # accepted
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if accepted(middle) else (low, middle)
    return high


def resolve_vocab_size(endpoint: str, model: str | None, card: dict, vocab_size: int | None,
                       tokenizer: str | None) -> int:
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
    raise UserError(f"--endpoint: {endpoint} does not say its vocabulary size; pass --vocab-size N (or "
                    "--tokenizer DIR) so that no prompt carries an out-of-vocabulary token id")
