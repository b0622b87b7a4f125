"""What `chunkbench serve` answers, in OpenAI's and vLLM's shapes: an error body, and a completion or chat
completion, whole or as streamed chunks.

One builder serves both APIs; what differs between them (a completion's `text`, a chat's `message` or streamed
`delta`, the object's name) is a parameter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from fastapi.responses import JSONResponse

Finish = tuple[str | None, str | int | None]  # (finish_reason, stop_reason)
GOING_ON: Finish = (None, None)  # a streamed chunk before the last
DONE = "data: [DONE]\n\n"  # the last server-sent event of a stream


def error_body(message: str, status: int = 400, param: str | None = None) -> dict:
    """OpenAI's error object; `param` names the request field at fault, when one is."""
    message = message.encode("utf-8", "backslashreplace").decode()  # it may quote a lone surrogate
    return {
        "error": {
            "message": message,
            "type": "invalid_request_error" if status < 500 else "server_error",
            "param": param,
            "code": None,
        }
    }


def error(message: str, status: int = 400, param: str | None = None, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(message, status, param), headers=headers)


class RequestError(Exception):
    """A request refused: raised where the fault is found, answered by the app with error()."""

    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message, self.param, self.status = message, param, status

    def response(self) -> JSONResponse:
        return error(self.message, self.status, self.param)


def sse(data: dict) -> str:
    """One server-sent event carrying `data` as JSON."""
    return f"data: {json.dumps(data)}\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def choice(chat: bool, content: str, finish: Finish = GOING_ON, streamed: bool = False, first: bool = False) -> dict:
    """The response's one choice: a completion's `text`; a chat's `message`, or while streaming its `delta`,
    whose first one names the role."""
    if not chat:
        said = {"text": content}
    elif not streamed:
        said = {"message": {"role": "assistant", "content": content}}
    else:
        said = {"delta": {"role": "assistant", "content": content} if first else {"content": content}}
    reason, stop_reason = finish
    return {"index": 0, **said, "logprobs": None, "finish_reason": reason, "stop_reason": stop_reason}


@dataclass(frozen=True)
class Reply:
    """One request's answer: what its body, or each of its streamed chunks, says about it."""

    id: str
    chat: bool
    model: str
    created: int  # Unix seconds

    def body(self, choices: list[dict], usage: dict | None = None, streamed: bool = False) -> dict:
        """The whole response or, `streamed`, one chunk of it (a chat's chunks are chat.completion.chunk
        objects, a completion's text_completion ones); with `usage` when it carries one."""
        kind = "chat.completion" if self.chat else "text_completion"
        data = {
            "id": self.id,
            "object": kind + (".chunk" if streamed and self.chat else ""),
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage is not None:
            data["usage"] = usage
        return data
