"""The small HTTP calls (a server's /health, /metrics, /version and /models, a tokenizer endpoint), over one TLS
context. httpx builds a context per call otherwise, loading the CA bundle: 48 ms of CPU a call here, while a
launched server's health is polled ten times a second as it starts (on a CPU machine, beside it)."""

from __future__ import annotations

import functools
import ssl

import httpx


@functools.cache
def tls() -> ssl.SSLContext:
    """httpx's default context (certifi's bundle, or SSL_CERT_FILE / SSL_CERT_DIR), made once."""
    return httpx.create_ssl_context()


def get(url: str, **kwargs) -> httpx.Response:
    return httpx.get(url, verify=tls(), **kwargs)


def post(url: str, **kwargs) -> httpx.Response:
    return httpx.post(url, verify=tls(), **kwargs)
