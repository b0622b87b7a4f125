"""What `chunkbench serve`'s OpenAPI document says it answers: the statuses, content types and error body it
really sends (FastAPI's default lists 200 and a 422 the server never sends, as JSON, for every route).

Checked by schemathesis against the running server (tests/serving/test_server_schema.py).
"""

from __future__ import annotations

import math

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from chunkbench.serving.openai_models import ErrorResponse

_ERROR = {"model": ErrorResponse}
SSE_EVENT = {
    "type": "object",
    "required": ["data"],
    "description": "One server-sent event: data is a JSON chunk "
    "(choices, and usage when asked for), an error object, or [DONE].",
    "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
}
POST_RESPONSES = {
    200: {
        "description": "The completion: a JSON object, or with stream=true server-sent events (data: {chunk} "
        "lines, a usage chunk with stream_options.include_usage, then data: [DONE]).",
        "content": {"application/json": {"schema": {"type": "object"}}, "text/event-stream": {"schema": SSE_EVENT}},
    },
    400: {
        **_ERROR,
        "description": "A bad request: a wrong type, a value out of range (this document states the "
        "ranges), invalid Unicode, a feature not implemented (a field other than its "
        "neutral value), a prompt that leaves no room for max_tokens under max_model_len "
        "(the message names both numbers), a chat without a chat template; `param` "
        "names the field.",
    },
    408: {**_ERROR, "description": "The request body took longer than the server's --body-timeout to arrive."},
    413: {**_ERROR, "description": "The request body is over the server's --max-body-bytes."},
    500: {**_ERROR, "description": "The engine failed the request (an error event, mid-stream)."},
    503: {**_ERROR, "description": "The engine is not running (see /health)."},
}
TEXT_RESPONSES = {
    200: {"description": "Plain text.", "content": {"text/plain": {"schema": {"type": "string"}}}},
    503: {
        "description": "The engine stopped; the text says why.",
        "content": {"text/plain": {"schema": {"type": "string"}}},
    },
}


DESCRIPTION = (
    "OpenAI-compatible API of chunkbench's engine. Unknown request fields are ignored (and logged once), "
    "as vLLM does. Values are not coerced: an integer is written as one (2.0 is refused where an integer "
    "is expected, though JSON Schema counts it as one), a bool as true/false. A prompt and its max_tokens "
    "must fit in max_model_len tokens together (prompt characters are bounded too), which a schema "
    "cannot state: such a request gets a 400 naming both numbers."
)


def document_errors(app: FastAPI) -> None:
    """Replace the app's OpenAPI generator with one that drops FastAPI's 422 (every validation error is a 400)."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes, description=DESCRIPTION)
            for path in schema["paths"].values():
                for operation in path.values():
                    operation["responses"].pop("422", None)
                    if "200" in operation["responses"] and "text/plain" in str(operation["responses"]["200"]):
                        operation["responses"]["200"]["content"].pop("application/json", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = _integer_bounds(schema)
        return app.openapi_schema

    app.openapi = openapi


def _integer_bounds(node):
    """FastAPI writes every bound as a float ("minimum": 1.0); an integer's bounds go back to integers, so that
    generators draw integers for them (the server takes no 1.0 for an integer: its models are strict). A float
    of 2**53 or more may have been rounded outward (seed's 2**63 - 1 became 2**63, which the server refuses):
    such a bound is stepped one float inward, so the document never admits what the server refuses."""
    if isinstance(node, list):
        return [_integer_bounds(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _integer_bounds(value) for key, value in node.items()}
    if out.get("type") == "integer":
        for key, inward in (
            ("minimum", math.inf),
            ("exclusiveMinimum", math.inf),
            ("maximum", -math.inf),
            ("exclusiveMaximum", -math.inf),
        ):
            value = out.get(key)
            if isinstance(value, float) and value.is_integer():
                out[key] = int(math.nextafter(value, inward) if abs(value) >= 2**53 else value)
    return out
