"""chunkbench: measure and tune chunked prefill for LLM serving."""

from chunkbench.llm import LLM
from chunkbench.version import __version__

__all__ = ["LLM", "__version__"]
