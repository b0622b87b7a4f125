"""Paged KV cache bookkeeping: which physical blocks hold which request's tokens, and prefix caching.

Token position p of a request lives in block `table[p // block_size]` at offset `p % block_size`, so its
cache slot is `table[p // block_size] * block_size + p % block_size`.

Prefix caching as in vLLM v1 (the details as in vLLM 0.32's vllm/v1/core/block_pool.py and
vllm/v1/core/kv_cache_manager.py): a full block is named by a hash of its tokens chained with its parent's hash,
so equal hashes mean equal prefixes, and a new request reuses the longest run of cached blocks its prompt starts
with. When a block is cached, which copy a lookup finds and which block is evicted: BlockManager. No torch here.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from .request import Request


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class BlockManager:
    """The block tables, the free list and the prefix cache.

    A block is cached when it is allocated for the chunk that fills it, before the step runs (a request admitted
    later in the same step reuses it: the step writes every layer's KV before that layer's attention reads it).
    Two blocks may hold the same hash (two requests computed it); a lookup finds the first cached, and the other
    serves once that one is evicted. Blocks carry reference counts; a freed block whose count drops to zero keeps
    its contents and hash and goes to the end of the free list if it is cached (evicted last, least recently
    freed first), to the front if not (reused first). A block is evicted only when it is taken from the front.

    The free list is a deque, so blocks are taken and freed in bulk at C speed (a simulated trace takes and
    frees millions). A free cached block that a new request reuses leaves the list lazily: its entry stays,
    marked stale (`_stale[block]`), and is skipped when it reaches the front. A block's stale entries always
    precede its live one (the live one is its latest free), so the first entry met is stale while it has any:
    only cached blocks get stale entries, and a block loses its hash (and may then be freed to the front) only
    when its live entry is taken, after its stale ones."""

    def __init__(self, num_blocks: int, block_size: int, enable_caching: bool = False) -> None:
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_caching = enable_caching
        self.ref_counts = [0] * num_blocks
        self.free_blocks: deque[int] = deque(range(num_blocks))  # least recently freed first; may hold stale entries
        self.num_free = num_blocks  # live entries of free_blocks
        self._stale = [0] * num_blocks  # per block: entries of free_blocks that are stale
        self._num_stale = 0
        self.block_tables: dict[str, list[int]] = {}
        self.block_hash: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}  # block hash -> the first block cached with it
        self._dupes: dict[int, list[int]] = {}  # block hash -> later blocks cached with it, in caching order
        self.num_registered: dict[str, int] = {}  # blocks of a request's table already hashed and cached

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free

    def free_list(self) -> list[int]:
        """The free blocks, least recently freed first (what the next takes will take, in order)."""
        skip, blocks = self._stale.copy(), []
        for block in self.free_blocks:
            if skip[block]:
                skip[block] -= 1
            else:
                blocks.append(block)
        return blocks

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

    def cache_blocks(self, request: Request, num_tokens: int) -> None:
        """Cache the request's blocks that its first `num_tokens` tokens fill (at most its known tokens): called
        when blocks are allocated for a chunk, as vLLM 0.32's allocate_slots does, and again after the step."""
        full = min(num_tokens, request.num_tokens) // self.block_size
        start = self.num_registered.get(request.request_id, 0)
        if full <= start:
            return
        table = self.block_tables[request.request_id]
        cached, block_hash = self.cached, self.block_hash
        for i, h in enumerate(self._block_hashes(request, full)[start:], start):
            block = table[i]
            if block_hash[block] is not None:  # a prefix hit: cached already
                continue
            block_hash[block] = h
            if h in cached:
                self._dupes.setdefault(h, []).append(block)
            else:
                cached[h] = block
        self.num_registered[request.request_id] = full

    def _evict(self, block: int) -> None:
        """Drop a block about to be overwritten from the prefix cache; a later block with its hash takes over."""
        h = self.block_hash[block]
        assert h is not None, f"block {block} is not in the prefix cache"
        self.block_hash[block] = None
        dupes = self._dupes.get(h)
        if self.cached.get(h) == block:
            if dupes:
                self.cached[h] = dupes.pop(0)
            else:
                del self.cached[h]
        elif dupes is not None:
            dupes.remove(block)
        if dupes is not None and not dupes:
            del self._dupes[h]

    # ---- allocation ----

    def blocks_needed(self, request: Request, num_new_tokens: int, hits: Sequence[int] = ()) -> int:
        """New blocks to take so the table covers the computed tokens plus `num_new_tokens`."""
        have = len(self.block_tables.get(request.request_id, ())) or len(hits)
        needed = -(-(request.num_computed_tokens + num_new_tokens) // self.block_size) - have  # cdiv, inlined: hot
        return needed if needed > 0 else 0

    def can_allocate(self, request: Request, num_new_tokens: int, hits: Sequence[int] = (), reserve: int = 0) -> bool:
        """Whether blocks for `num_new_tokens` more tokens are free, leaving `reserve` blocks free (vLLM's
        watermark)."""
        reused_free = sum(1 for b in hits if self.ref_counts[b] == 0)  # taking them shrinks the free list
        return self.blocks_needed(request, num_new_tokens, hits) + reserve <= self.num_free - reused_free

    def allocate(self, request: Request, num_new_tokens: int, hits: Sequence[int] = ()) -> list[int]:
        """Give a newly admitted request its cached prefix blocks `hits`, then blocks for `num_new_tokens`."""
        assert request.request_id not in self.block_tables, f"{request.request_id} already holds blocks"
        for block in hits:
            if self.ref_counts[block] == 0:  # a free cached block: its free-list entry goes stale
                self._stale[block] += 1
                self._num_stale += 1
                self.num_free -= 1
            self.ref_counts[block] += 1
        if self._num_stale > self.num_blocks:  # bound the list's length (a long-lived server reusing prefixes)
            self.free_blocks = deque(self.free_list())
            self._stale, self._num_stale = [0] * self.num_blocks, 0
        self.block_tables[request.request_id] = list(hits)
        self.num_registered[request.request_id] = len(hits)
        return self.append(request, num_new_tokens)

    def append(self, request: Request, num_new_tokens: int) -> list[int]:
        """Grow a request's table to cover `num_new_tokens` more tokens; the caller checked can_allocate."""
        needed = self.blocks_needed(request, num_new_tokens)
        if needed > self.num_free:
            raise RuntimeError(f"append: {needed} blocks needed, {self.num_free} free")
        table = self.block_tables.setdefault(request.request_id, [])
        if needed:
            table += self._take(needed)
        if self.enable_caching:
            self.cache_blocks(request, request.num_computed_tokens + num_new_tokens)
        return table

    def append_block(self, request_id: str) -> None:
        """One more block for a request the caller knows needs exactly one (the simulator's fast path: a
        decode whose table is full), as append() takes it; the caller checked that a block is free."""
        self.block_tables[request_id] += self._take(1)

    def _take(self, n: int) -> list[int]:
        """The n least recently freed blocks, each evicted from the prefix cache if it holds a cached block.
        Loops kept tight: a simulated trace takes and frees millions of blocks."""
        popleft, refs = self.free_blocks.popleft, self.ref_counts
        blocks = [popleft() for _ in range(n)]
        if self._num_stale:
            blocks = self._live(blocks)
        self.num_free -= n
        for block in blocks:
            if refs[block]:
                raise AssertionError(f"block {block} on the free list is in use")
            refs[block] = 1
        if self.enable_caching:
            block_hash = self.block_hash
            for block in blocks:
                if block_hash[block] is not None:  # evict: its contents are about to be overwritten
                    self._evict(block)
        return blocks

    def _live(self, popped: list[int]) -> list[int]:
        """The popped entries less the stale ones, topped up from the front to as many live blocks."""
        live: list[int] = []
        stale, popleft = self._stale, self.free_blocks.popleft
        want = len(popped)
        popped.reverse()  # consumed from the end, in the order popped
        while len(live) < want:
            block = popped.pop() if popped else popleft()
            if stale[block]:
                stale[block] -= 1
                self._num_stale -= 1
            else:
                live.append(block)
        return live

    def free(self, request: Request) -> None:
        """Release a request's blocks (finished, aborted or preempted). Freeing twice is a no-op.
        Tail blocks are freed first, so they are evicted before the prefix blocks others may share; uncached
        blocks go to the front of the free list (reused first, as vLLM 0.32), cached ones to the end."""
        self.num_registered.pop(request.request_id, None)
        released: list[int] = []
        uncached: list[int] = []
        refs = self.ref_counts
        hashed = self.block_hash if self.enable_caching else None
        for block in reversed(self.block_tables.pop(request.request_id, [])):
            left = refs[block] = refs[block] - 1
            if left == 0:
                (released if hashed is not None and hashed[block] is not None else uncached).append(block)
            elif left < 0:
                raise AssertionError(f"block {block} freed more often than taken")
        if uncached:
            uncached.reverse()
            self.free_blocks.extendleft(uncached)  # the tail block first in line
        self.free_blocks.extend(released)
        self.num_free += len(released) + len(uncached)
