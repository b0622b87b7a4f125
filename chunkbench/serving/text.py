"""Text in and out of `chunkbench serve`: the tokenizer, the chat template, and incremental detokenizing with
stop strings, as vLLM does them.

This file imports nothing from chunkbench (only transformers, lazily), so a test can load it by path in another
environment (the vLLM tier's, with another transformers version) and check the chat template there too.
"""

from __future__ import annotations


class ByteTokenizer:
    """The stand-in for dummy weights: each UTF-8 byte is one token, and a token decodes to the byte id % 256."""

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(text.encode("utf-8"))

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


def load_tokenizer(hf_dir: str | None):
    """The directory's Hugging Face tokenizer; the byte stand-in when there is no directory or no tokenizer."""
    if hf_dir:
        try:
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(hf_dir, local_files_only=True)
        except (OSError, ValueError):
            pass
    return ByteTokenizer()


class ChatTemplateError(ValueError):
    """The chat cannot be rendered: the model has no chat template, or its template refused the messages."""


def chat_prompt_ids(tokenizer, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
    """The chat's prompt token ids. As vLLM: render the template to text, then tokenize it without adding
    special tokens (the template writes its own BOS). Rendering to text sidesteps what tokenize=True returns,
    which changed in transformers 5 (a BatchEncoding, not a list of ids). The byte stand-in has no template:
    "role: content" lines, then "assistant: "."""
    if isinstance(tokenizer, ByteTokenizer):
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + (
            "assistant: " if add_generation_prompt else ""
        )
        return tokenizer.encode(text)
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError(
            "this model's tokenizer has no chat template (no chat_template in its "
            "tokenizer_config.json, no chat_template.jinja): use /v1/completions"
        )
    try:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    except Exception as exc:  # noqa: BLE001 - jinja's TemplateError, or a template's raise_exception()
        raise ChatTemplateError(
            f"the model's chat template refused these messages: {type(exc).__name__}: {exc}"
        ) from None
    return list(tokenizer.encode(text, add_special_tokens=False))


class TextStream:
    """Token ids in, text out, one token at a time, as vLLM's incremental detokenizer: each token's text is the
    decoded window's growth (so a multi-byte character split over tokens comes out whole, and a word keeps its
    leading space), the window starting in the last prompt tokens. A stop string ends the text where it begins
    (or after it, with include_stop); while streaming, the last len(longest stop) - 1 characters are held back,
    since they may be the start of a stop string."""

    PROMPT_CONTEXT = 5  # prompt tokens decoded with the first outputs (vLLM's INITIAL_..._OFFSET)
    MAX_HELD_TOKENS = 8  # a partial character longer than this is a real replacement character, not a split one

    def __init__(
        self,
        tokenizer,
        prompt_ids: list[int],
        stop: list[str] = (),
        include_stop: bool = False,
        skip_special_tokens: bool = True,
    ) -> None:
        self.tokenizer, self.stop, self.include_stop = tokenizer, [s for s in stop if s], include_stop
        self.skip_special_tokens = skip_special_tokens
        self.ids = list(prompt_ids[-self.PROMPT_CONTEXT :])
        self.prefix, self.read = 0, len(self.ids)
        self.text, self.sent = "", 0
        self.hold = max((len(s) for s in self.stop), default=1) - 1 if not include_stop else 0
        self.stop_reason: str | None = None

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def _advance(self, final: bool) -> str:
        prefix_text = self._decode(self.ids[self.prefix : self.read])
        new_text = self._decode(self.ids[self.prefix :])
        if len(new_text) > len(prefix_text) and (
            final or not new_text.endswith("\ufffd") or len(self.ids) - self.read > self.MAX_HELD_TOKENS
        ):
            self.prefix, self.read = self.read, len(self.ids)
            return new_text[len(prefix_text) :]
        return ""

    def _add_text(self, delta: str) -> bool:
        self.text += delta
        for stop in self.stop if delta else ():
            at = self.text.find(stop, max(0, len(self.text) - len(delta) - len(stop) + 1))
            if at != -1:
                self.text = self.text[: at + (len(stop) if self.include_stop else 0)]
                self.stop_reason = stop
                return True
        return False

    def push(self, token_id: int) -> bool:
        """Add one sampled token; True when a stop string ends the text (no later token counts)."""
        self.ids.append(token_id)
        return self._add_text(self._advance(final=False))

    def finish(self) -> bool:
        """The request ended: decode what was held back as a partial character. True if that hit a stop."""
        return self.stop_reason is None and self.read < len(self.ids) and self._add_text(self._advance(final=True))

    def take(self, final: bool) -> str:
        """The text not yet sent that may be sent now (all of it once `final`)."""
        end = len(self.text) if final or self.stop_reason is not None else max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : end], end
        return out
