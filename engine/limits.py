"""Whether a request fits the model: max_model_len's rule in one place, for the engine, the server, its OpenAPI
document and workloads.

vLLM 0.32's rule: a prompt and the output tokens it must leave room for fit in max_model_len together. The
engine needs room for none: it refuses only a prompt longer than max_model_len, and ends a request once it
holds max_model_len tokens (a prompt of exactly max_model_len still gets one token, whose KV needs no slot).
The OpenAI server needs room for the max_tokens it is asked for, at least one, so there a prompt of
max_model_len tokens is refused.
"""

from __future__ import annotations


def longest_prompt(max_model_len: int, max_tokens: int = 0) -> int:
    """The most prompt tokens that leave room for `max_tokens` output tokens (0: the engine's bound)."""
    return max_model_len - max_tokens


def prompt_fits(prompt_len: int, max_model_len: int, max_tokens: int = 0, field: str = "max_tokens") -> str | None:
    """None when a prompt of `prompt_len` tokens leaves room for `max_tokens` output tokens, else why not: in the
    engine's words for max_tokens 0, in vLLM's OpenAI server's otherwise (`field`: the request field that asked
    for the max_tokens)."""
    if prompt_len <= longest_prompt(max_model_len, max_tokens):
        return None
    if max_tokens == 0:
        return f"prompt has {prompt_len} tokens, more than max_model_len ({max_model_len})"
    context = f"This model's maximum context length is {max_model_len} tokens. However, "
    if prompt_len > longest_prompt(max_model_len, max_tokens=1):
        return context + f"your prompt contains {prompt_len} input tokens, which leaves no room for an output token."
    return context + (
        f"you requested {field}={max_tokens} output tokens and your prompt contains {prompt_len} input "
        f"tokens, for a total of {max_tokens + prompt_len} tokens: at most "
        f"{max_model_len - prompt_len} output tokens fit."
    )
