"""Paged KV cache bookkeeping: which physical blocks hold which request's tokens.

Token position p of a request lives in block `table[p // block_size]` at offset `p % block_size`, so its
cache slot is `table[p // block_size] * block_size + p % block_size`. Blocks carry reference counts and the
free list is kept in release order (least recently freed first), the shape prefix caching needs.
No torch here.
"""

from __future__ import annotations

from collections import deque

from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))
        self.block_tables: dict[str, list[int]] = {}
        self.peak_used_blocks = 0

    @property
    def num_free_blocks(self) -> int:
        return len(self.free_blocks)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    def blocks_needed(self, request: Request, num_new_tokens: int) -> int:
        """Blocks to add so the request's table covers its computed tokens plus `num_new_tokens`."""
        have = len(self.block_tables.get(request.request_id, ()))
        return max(0, cdiv(request.num_computed_tokens + num_new_tokens, self.block_size) - have)

    def can_allocate(self, request: Request, num_new_tokens: int) -> bool:
        return self.blocks_needed(request, num_new_tokens) <= len(self.free_blocks)

    def allocate(self, request: Request, num_new_tokens: int) -> list[int]:
        """Give a newly admitted request the blocks for its first `num_new_tokens` tokens."""
        assert request.request_id not in self.block_tables, f"{request.request_id} already holds blocks"
        self.block_tables[request.request_id] = []
        return self.append(request, num_new_tokens)

    def append(self, request: Request, num_new_tokens: int) -> list[int]:
        """Grow a request's table to cover `num_new_tokens` more tokens; the caller checked can_allocate."""
        needed = self.blocks_needed(request, num_new_tokens)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"append: {needed} blocks needed, {len(self.free_blocks)} free")
        table = self.block_tables.setdefault(request.request_id, [])
        for _ in range(needed):
            block = self.free_blocks.popleft()
            assert self.ref_counts[block] == 0, f"block {block} on the free list is in use"
            self.ref_counts[block] = 1
            table.append(block)
        self.peak_used_blocks = max(self.peak_used_blocks, self.num_used_blocks)
        return table

    def free(self, request: Request) -> None:
        """Release a request's blocks (finished, aborted or preempted). Freeing twice is a no-op."""
        for block in reversed(self.block_tables.pop(request.request_id, [])):
            self.ref_counts[block] -= 1
            assert self.ref_counts[block] >= 0, f"block {block} freed more often than taken"
            if self.ref_counts[block] == 0:
                self.free_blocks.append(block)
