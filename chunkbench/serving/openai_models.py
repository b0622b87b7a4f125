"""The request bodies `chunkbench serve` takes, as pydantic models built for one server's limits, so that its
OpenAPI document states every limit it enforces (token id range, prompt length, sampling ranges).

Tolerant as vLLM's protocol is: a field the server does not know is accepted (and logged once by the server);
a field it knows but does not implement is accepted at its neutral value (repetition_penalty 1, logprobs null,
presence_penalty 0, ...) and refused otherwise, with a 400 naming it. Values are not coerced: "yes" is not a
bool, true is not 1, 2.0 is not a token id.
"""

from __future__ import annotations

import logging
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, model_validator

from chunkbench.engine.limits import longest_prompt

logger = logging.getLogger("chunkbench.serving.server")
INT64 = dict(ge=-(2**63), le=2**63 - 1)  # vLLM's bounds for a seed
MAX_STOP_STRINGS = 64


def _valid_unicode(text: str) -> str:
    """JSON's "\\ud800" parses to a lone surrogate, which no tokenizer (nor UTF-8) can take."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate at character {exc.start}: not valid Unicode") from None
    return text


Text = Annotated[str, AfterValidator(_valid_unicode)]


def neutral(kind: type, value: Any, what: str):
    """A field accepted only at `value` (or null), the value at which it changes nothing; the schema says so.
    One whose value holds a string is named outside the class (pyflakes reads a string in an annotation as a
    forward reference)."""

    def check(given):
        if given is not None and given != value:
            raise ValueError(f"{what} is not implemented by chunkbench serve: only {value!r} (or null) is accepted")
        return given

    schema = {
        "anyOf": [{"const": value}, {"type": "null"}],
        "description": f"{what}: not implemented, only {value!r} or null",
    }
    return Annotated[kind | None, AfterValidator(check), WithJsonSchema(schema)]


class Tolerant(BaseModel):
    """Unknown fields kept in model_extra (the server logs and ignores them); known ones strictly typed."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="after")
    def _unknown_names_are_text(self):
        for name in self.model_extra or {}:
            _valid_unicode(name)
        return self


class StreamOptions(Tolerant):
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False  # vLLM: every chunk carries the usage so far


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: int | str | None = None


class ErrorResponse(BaseModel):
    """The body of every 4xx and 5xx, as OpenAI's: `param` names the field at fault when one is."""

    error: ErrorDetail


def request_models(vocab_size: int, max_model_len: int, max_prompt_chars: int) -> tuple[type, type]:
    """(CompletionBody, ChatBody) for a server of this vocabulary, context length and prompt size limit."""
    # The token id range and the prompt's length are checked by the server (with messages that name
    # max_model_len and the vocabulary), and stated here for the OpenAPI document. A prompt and max_tokens, at
    # # least one token each, fit in max_model_len together (engine/limits.py), so either is at most
    # `most_tokens`; the room a given prompt leaves is checked per request, with both numbers.
    most_tokens = longest_prompt(max_model_len, max_tokens=1)
    TokenId = Annotated[int, Field(json_schema_extra={"minimum": 0, "maximum": vocab_size - 1})]
    MaxTokens = Annotated[int, Field(ge=1, json_schema_extra={"maximum": most_tokens})]
    Body = _body(TokenId, most_tokens)
    return (
        _completion_body(Body, TokenId, MaxTokens, most_tokens, max_prompt_chars),
        _chat_body(Body, MaxTokens, max_prompt_chars),
    )


def _body(TokenId, most_tokens: int) -> type:
    """The fields both APIs take: sampling, stopping, streaming, and the known ones not implemented."""
    StopText = Annotated[Text, Field(min_length=1)]
    TextFormat = neutral(dict, {"type": "text"}, "response_format")

    class Body(Tolerant):
        model: Text | None = None
        temperature: Annotated[float, Field(ge=0, le=2)] | None = 1.0
        top_p: Annotated[float, Field(gt=0, le=1)] | None = 1.0
        top_k: Annotated[int, Field(ge=-1)] | None = None  # -1 or 0: no limit
        min_tokens: Annotated[int, Field(ge=0, json_schema_extra={"maximum": most_tokens})] = 0
        seed: Annotated[int, Field(**INT64)] | None = None
        ignore_eos: bool = False
        stop: StopText | Annotated[list[StopText], Field(max_length=MAX_STOP_STRINGS)] | None = None
        stop_token_ids: Annotated[list[TokenId], Field(max_length=MAX_STOP_STRINGS)] | None = None
        include_stop_str_in_output: bool = False
        skip_special_tokens: bool = True
        stream: bool | None = False
        stream_options: StreamOptions | None = None
        n: Annotated[int, Field(ge=1, le=1)] | None = 1
        user: Text | None = None
        # Known, not implemented: accepted at their neutral values only.
        best_of: neutral(int, 1, "best_of") = None
        presence_penalty: neutral(float, 0.0, "presence_penalty") = None
        frequency_penalty: neutral(float, 0.0, "frequency_penalty") = None
        repetition_penalty: neutral(float, 1.0, "repetition_penalty") = None
        length_penalty: neutral(float, 1.0, "length_penalty") = None
        min_p: neutral(float, 0.0, "min_p") = None
        use_beam_search: neutral(bool, False, "use_beam_search") = None
        logit_bias: neutral(dict, {}, "logit_bias") = None
        prompt_logprobs: neutral(int, 0, "prompt_logprobs") = None
        response_format: TextFormat = None

        def sampling_kwargs(self) -> dict:
            return dict(
                temperature=1.0 if self.temperature is None else self.temperature,
                top_p=1.0 if self.top_p is None else self.top_p,
                top_k=self.top_k or 0,
                min_tokens=self.min_tokens,
                seed=self.seed,
                ignore_eos=self.ignore_eos,
                stop_token_ids=tuple(self.stop_token_ids or ()),
            )

        @property
        def stop_strings(self) -> list[str]:
            return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])

    return Body


def _completion_body(Body: type, TokenId, MaxTokens, longest: int, max_prompt_chars: int) -> type:
    PromptText = Annotated[Text, Field(min_length=1, json_schema_extra={"maxLength": max_prompt_chars})]
    PromptIds = Annotated[list[TokenId], Field(min_length=1, json_schema_extra={"maxItems": longest})]
    NoSuffix = neutral(str, "", "suffix")

    class CompletionBody(Body):
        prompt: PromptText | PromptIds
        max_tokens: MaxTokens | None = 16  # null: 16, as vLLM
        echo: bool | None = False  # the prompt's text before the completion
        logprobs: neutral(int, 0, "logprobs") = None
        suffix: NoSuffix = None

    return CompletionBody


def _chat_body(Body: type, MaxTokens, max_prompt_chars: int) -> type:
    ContentText = Annotated[Text, Field(json_schema_extra={"maxLength": max_prompt_chars})]
    NoToolChoice, NoTemplate = neutral(str, "none", "tool_choice"), neutral(str, "", "chat_template")

    class TextPart(Tolerant):
        type: Annotated[str, AfterValidator(_text_part), WithJsonSchema({"const": "text"})]
        text: Text

    class ChatMessage(Tolerant):
        role: Text
        content: ContentText | list[TextPart] | None = None
        name: Text | None = None

        def template_dict(self) -> dict:
            """As vLLM hands messages to the template: text parts joined by newlines."""
            content = self.content if not isinstance(self.content, list) else "\n".join(p.text for p in self.content)
            return {"role": self.role, "content": content or "", **({"name": self.name} if self.name else {})}

    class ChatBody(Body):
        messages: Annotated[list[ChatMessage], Field(min_length=1)]
        max_tokens: MaxTokens | None = None  # null: up to max_model_len
        max_completion_tokens: MaxTokens | None = None  # wins over max_tokens when both are given
        add_generation_prompt: bool = True
        logprobs: neutral(bool, False, "logprobs") = None
        top_logprobs: neutral(int, 0, "top_logprobs") = None
        echo: neutral(bool, False, "echo") = None
        continue_final_message: neutral(bool, False, "continue_final_message") = None
        tools: neutral(list, [], "tools") = None
        tool_choice: NoToolChoice = None
        chat_template: NoTemplate = None
        chat_template_kwargs: neutral(dict, {}, "chat_template_kwargs") = None

    return ChatBody


def _text_part(kind: str) -> str:
    if kind != "text":
        raise ValueError(f"content parts of type {kind!r} are not supported: only 'text'")
    return kind


class UnknownFields:
    """Logs each unknown request field the first time it is seen (vLLM logs ignored fields too); bounded."""

    def __init__(self, limit: int = 1000) -> None:
        self.seen: set[str] = set()
        self.limit = limit

    def report(self, body) -> None:
        names = [
            *body.model_extra,
            *(f"stream_options.{k}" for k in (body.stream_options.model_extra if body.stream_options else ())),
        ]
        names += [f"messages.{k}" for m in getattr(body, "messages", ()) for k in m.model_extra]
        new = sorted(set(names) - self.seen)
        if new and len(self.seen) < self.limit:
            self.seen.update(new)
            logger.warning(
                "ignored request fields chunkbench serve does not use: %s",
                ", ".join(ascii(n[:40]) for n in new[:10]) + (f" and {len(new) - 10} more" if len(new) > 10 else ""),
            )
