"""Paged KV cache bookkeeping: which physical blocks hold which request's tokens, and prefix caching.

Token position p of a request lives in block `table[p // block_size]` at offset `p % block_size`, so its
cache slot is `table[p // block_size] * block_size + p % block_size`.

Prefix caching (as in vLLM v1): a full block is named by a hash of its tokens chained with its parent's
hash, so equal hashes mean equal prefixes. Blocks carry reference counts; a block whose count drops to
zero goes to the end of the free list but keeps its contents and hash, and is evicted only when it is
taken from the front of the free list (least recently freed first). A new request reuses the longest
run of cached blocks its prompt starts with. No torch here.
"""

from __future__ import annotations

from collections import OrderedDict

from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_counts = [0] * num_blocks
        self.free_blocks: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # LRU first
        self.block_tables: dict[str, list[int]] = {}
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> block holding it
        self.num_registered: dict[str, int] = {}  # blocks of a request's table already hashed and cached

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_blocks)

    def block_table(self, request_id: str) -> list[int]:
        return self.block_tables.get(request_id, [])

    # ---- prefix caching ----

    def _block_hashes(self, request: Request, num_blocks: int) -> list[int]:
        """Hashes of the request's first `num_blocks` full blocks, computed once and kept on the request."""
        hashes = request.block_hashes
        bs = self.block_size
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else None
            hashes.append(hash((parent, tuple(request.token_ids_between(i * bs, (i + 1) * bs)))))
        return hashes[:num_blocks]

    def cached_prefix(self, request: Request) -> list[int]:
        """Blocks holding the longest cached run of the request's leading full blocks. At least one token is
        always left to compute, so that the step that computes it can sample the next."""
        if not self.enable_caching:
            return []
        hits = []
        for h in self._block_hashes(request, (request.num_tokens - 1) // self.block_size):
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def _register_full_blocks(self, request: Request) -> None:
        """Cache the request's blocks that its computed tokens have filled."""
        full = request.num_computed_tokens // self.block_size
        start = self.num_registered.get(request.request_id, 0)
        if full <= start:
            return
        table = self.block_tables[request.request_id]
        for i, h in enumerate(self._block_hashes(request, full)[start:], start):
            block = table[i]
            if self.block_hash[block] is None and h not in self.cached:
                self.block_hash[block] = h
                self.cached[h] = block
        self.num_registered[request.request_id] = full

    # ---- allocation ----

    def blocks_needed(self, request: Request, num_new_tokens: int, hits: list[int] = ()) -> int:
        """New blocks to take so the table covers the computed tokens plus `num_new_tokens`."""
        have = len(self.block_tables.get(request.request_id, ())) or len(hits)
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - have  # cdiv, inlined: hot
        return needed if needed > 0 else 0

    def can_allocate(self, request: Request, num_new_tokens: int, hits: list[int] = ()) -> bool:
        reused_free = sum(1 for b in hits if self.ref_counts[b] == 0)  # taking them shrinks the free list
        return self.blocks_needed(request, num_new_tokens, hits) <= len(self.free_blocks) - reused_free

    def allocate(self, request: Request, num_new_tokens: int, hits: list[int] = ()) -> list[int]:
        """Give a newly admitted request its cached prefix blocks `hits`, then blocks for `num_new_tokens`."""
        assert request.request_id not in self.block_tables, f"{request.request_id} already holds blocks"
        for block in hits:
            if self.ref_counts[block] == 0:
                del self.free_blocks[block]
            self.ref_counts[block] += 1
        self.block_tables[request.request_id] = list(hits)
        self.num_registered[request.request_id] = len(hits)
        return self.append(request, num_new_tokens)

    def append(self, request: Request, num_new_tokens: int) -> list[int]:
        """Grow a request's table to cover `num_new_tokens` more tokens; the caller checked can_allocate."""
        needed = self.blocks_needed(request, num_new_tokens)
        if needed > len(self.free_blocks):
            raise RuntimeError(f"append: {needed} blocks needed, {len(self.free_blocks)} free")
        table = self.block_tables.setdefault(request.request_id, [])
        if needed:
            table += self._take(needed)
        return table

    def append_block(self, request_id: str) -> None:
        """One more block for a request the caller knows needs exactly one (the simulator's fast path: a
        decode whose table is full), as append() takes it; the caller checked that a block is free."""
        self.block_tables[request_id] += self._take(1)

    def _take(self, n: int) -> list[int]:
        """The n least recently freed blocks, each evicted from the prefix cache if it holds a cached block.
        Loops kept tight: a simulated trace takes and frees millions of blocks."""
        popitem, refs = self.free_blocks.popitem, self.ref_counts
        blocks = [popitem(last=False)[0] for _ in range(n)]
        for block in blocks:
            if refs[block]:
                raise AssertionError(f"block {block} on the free list is in use")
            refs[block] = 1
        if self.enable_caching:
            for block in blocks:
                h = self.block_hash[block]
                if h is not None:  # evict: its contents are about to be overwritten
                    if self.cached.get(h) == block:
                        del self.cached[h]
                    self.block_hash[block] = None
        return blocks

    def computed(self, request: Request) -> None:
        """The request's computed tokens advanced: cache any block they filled."""
        if self.enable_caching:
            self._register_full_blocks(request)

    def free(self, request: Request) -> None:
        """Release a request's blocks (finished, aborted or preempted). Freeing twice is a no-op.
        Tail blocks are freed first, so they are evicted before the prefix blocks others may share."""
        self.num_registered.pop(request.request_id, None)
        refs, free = self.ref_counts, self.free_blocks
        for block in reversed(self.block_tables.pop(request.request_id, [])):
            left = refs[block] = refs[block] - 1
            if left == 0:
                free[block] = None
            elif left < 0:
                raise AssertionError(f"block {block} freed more often than taken")
