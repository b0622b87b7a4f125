"""The free list keeps vLLM 0.32's order (take from the front; free a cached block to the back, an uncached one
to the front; a reused free cached block leaves it) however its stale entries fall: checked against a plain
OrderedDict model of it."""

from collections import OrderedDict

from chunkbench.engine.block_manager import BlockManager
from chunkbench.engine.request import Request, SamplingParams
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

BLOCK = 4


def request(rid: str, tokens: int) -> Request:
    return Request(
        request_id=rid, prompt_token_ids=[1] * tokens, sampling=SamplingParams(), eos_token_id=None, arrival_time=0.0
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["admit", "grow", "free"]),
            st.integers(0, 7),
            st.integers(1, 12),
            st.lists(st.integers(0, 5), max_size=4),
        ),
        max_size=60,
    )
)
@example(
    ops=[
        ("admit", 0, 1, []),
        ("free", 0, 1, []),  # block 0, uncached, freed to the front: [0, 1, 2, 3, 4, 5]
        ("admit", 1, 2, [1, 2, 3, 4]),
        ("free", 1, 1, []),  # four stale entries of cached hits, freed back
        ("admit", 2, 2, [2, 3, 4]),
    ]
)  # seven stale: compacted, keeping the order
def test_free_list_order_matches_an_ordered_dict(ops):
    num_blocks = 6  # small, so reused free blocks pile up stale entries past num_blocks (the compaction)
    bm = BlockManager(num_blocks, BLOCK, enable_caching=True)
    model: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
    refs = [0] * num_blocks
    live: dict[str, Request] = {}
    for op, slot, tokens, hit_picks in ops:
        rid = str(slot)
        if op == "admit" and rid not in live:
            held = [b for b in range(num_blocks) if refs[b] or b in model]
            hits = list(dict.fromkeys(held[p % len(held)] for p in hit_picks))  # any block may be "cached"
            r = request(rid, tokens)
            r.num_computed_tokens = len(hits) * BLOCK
            n = tokens % 2  # 0: the hits cover it, nothing is taken
            for b in hits:  # a hit is a cached block: give it a hash of its own if it has none
                if bm.block_hash[b] is None:
                    bm.block_hash[b] = -1 - b
            if not bm.can_allocate(r, n, hits):
                continue
            before = len(bm.free_list())
            bm.allocate(r, n, hits)
            for b in hits:
                if refs[b] == 0:
                    del model[b]
                refs[b] += 1
            taken = bm.block_tables[rid][len(hits) :]
            assert taken == [model.popitem(last=False)[0] for _ in taken]  # the least recently freed, in order
            assert bm.num_free == before - len(taken) - sum(1 for b in hits if refs[b] == 1)
            for b in taken:
                refs[b] += 1
            live[rid] = r
        elif op == "grow" and rid in live:
            r = live[rid]
            r.num_computed_tokens = len(bm.block_tables[rid]) * BLOCK
            if bm.can_allocate(r, tokens):
                old = len(bm.block_tables[rid])
                bm.append(r, tokens)
                taken = bm.block_tables[rid][old:]
                assert taken == [model.popitem(last=False)[0] for _ in taken]
                for b in taken:
                    refs[b] += 1
        elif op == "free" and rid in live:
            front = []
            for b in reversed(bm.block_tables[rid]):
                refs[b] -= 1
                if refs[b] == 0:
                    if bm.block_hash[b] is None:
                        front.append(b)
                    else:
                        model[b] = None
            for b in reversed(front):  # the tail block ends up first
                model[b] = None
                model.move_to_end(b, last=False)
            bm.free(live.pop(rid))
        assert bm.free_list() == list(model)
        assert bm.num_free == len(model) and bm.ref_counts == refs
        assert len(bm.free_blocks) <= 2 * num_blocks + 4  # stale entries stay bounded
