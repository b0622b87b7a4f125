"""chunkbench: measure and tune chunked prefill for LLM serving."""

from .llm import LLM

__all__ = ["LLM"]
__version__ = "0.1.0"
