"""chunkbench's version, on the bottom floor: the server configs it writes name it."""

__version__ = "0.1.0"
