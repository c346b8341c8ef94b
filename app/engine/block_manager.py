"""KV block bookkeeping: ref-counted blocks, an LRU free list, prefix caching, copy-on-write.

The block manager owns block *ids*; backends own the memory behind them. A block whose ref count
drops to zero goes back to the free list but keeps its content hash, so a later request with the
same prefix can revive it until the block is handed out again (evicted, least recently freed first).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable

from app.engine.sequence import Sequence


def hash_block(parent: int | None, tokens: Iterable[int]) -> int:
    """Chained hash: a block's identity is its tokens plus everything before it."""
    return hash((parent, tuple(tokens)))


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[int | None] = [None] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))
        self.cached: dict[int, int] = {}  # content hash -> block id
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found cached

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _update_hashes(self, seq: Sequence) -> None:
        bs = self.block_size
        while (len(seq.block_hashes) + 1) * bs <= seq.num_tokens:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(hash_block(parent, seq.tokens_range(i * bs, (i + 1) * bs)))

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding a cached prefix of seq (never all of it: one token must be computed)."""
        if not self.enable_prefix_caching:
            return []
        self._update_hashes(seq)
        max_blocks = (seq.num_tokens - 1) // self.block_size
        hits: list[int] = []
        for h in seq.block_hashes[:max_blocks]:
            block = self.cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens

    def blocks_needed(self, seq: Sequence, num_tokens: int, cached: list[int] = ()) -> int:
        """Free blocks consumed to give seq room for num_tokens (reviving cached ones counts too)."""
        new = max(self.blocks_for(num_tokens) - len(seq.block_table) - len(cached), 0)
        return new + sum(1 for b in cached if self.ref_counts[b] == 0)

    def can_allocate(self, num_blocks: int, reserve: int = 0) -> bool:
        return len(self.free) - num_blocks >= reserve

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_tokens: int, cached: list[int] = ()) -> None:
        """Extend seq's block table so it covers num_tokens slots, first with cached blocks."""
        for block in cached:
            self._ref(block)
            seq.block_table.append(block)
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_free())

    def free_seq(self, seq: Sequence) -> None:
        # Reverse order: a prefix's tail is evicted before its head, which more requests share.
        for block in reversed(seq.block_table):
            self._unref(block)
        seq.block_table = []
        seq.num_registered_blocks = 0

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """child shares every block of parent; a write into a shared block copies it first."""
        child.block_table = list(parent.block_table)
        child.block_hashes = list(parent.block_hashes)
        for block in child.block_table:
            self._ref(block)

    def copy_on_write(self, seq: Sequence, start: int, end: int) -> list[tuple[int, int]]:
        """Make the blocks that positions [start, end) write into private; returns (src, dst) copies."""
        pairs = []
        bs = self.block_size
        for i in range(start // bs, (end - 1) // bs + 1):
            block = seq.block_table[i]
            if self.ref_counts[block] > 1:
                new = self._take_free()
                self.ref_counts[block] -= 1
                seq.block_table[i] = new
                pairs.append((block, new))
        return pairs

    def register_computed(self, seq: Sequence) -> None:
        """Publish the hashes of seq's blocks that are now full and computed."""
        if not self.enable_prefix_caching:
            return
        n_full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if n_full <= seq.num_registered_blocks:
            return
        self._update_hashes(seq)
        for i in range(seq.num_registered_blocks, n_full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if self.block_hash[block] is None and h not in self.cached:
                self.cached[h] = block
                self.block_hash[block] = h
        seq.num_registered_blocks = n_full

    def reset_prefix_cache(self) -> None:
        for block in list(self.cached.values()):
            self.block_hash[block] = None
        self.cached.clear()

    # ---- internals -----------------------------------------------------------------------
    def _ref(self, block: int) -> None:
        if self.ref_counts[block] == 0:
            del self.free[block]
        self.ref_counts[block] += 1

    def _unref(self, block: int) -> None:
        if self.ref_counts[block] <= 0:
            raise RuntimeError(f"block {block} freed twice")
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self.free[block] = None
            if self.block_hash[block] is None:
                # Nothing to revive: hand this block out before ones holding cached prefixes.
                self.free.move_to_end(block, last=False)

    def _take_free(self) -> int:
        if not self.free:
            raise RuntimeError("out of KV blocks (the scheduler should have checked)")
        block, _ = self.free.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
        self.ref_counts[block] = 1
        return block
