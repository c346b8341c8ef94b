"""KV block bookkeeping: ref-counted blocks, an LRU free list and automatic prefix caching.

The block manager owns block *ids*; backends own the memory behind them. A block whose ref count
drops to zero goes back to the free list but keeps its digest, so a later request with the same
prefix (and the same cache salt) can revive it until the block is handed out again (evicted,
least recently freed first).

Sharing is only ever of full, computed blocks, and a sequence never writes into a block it did
not fill itself (a cached prefix stops one token short of the prompt), so blocks need no
copy-on-write: n > 1 samples are separate sequences that share the prompt through this cache.

Sliding windows (``release_window``, set when every layer of the model slides): a query at position
p reads keys p - window < j <= p only, so once a sequence has computed n tokens every block wholly
before n - window + 1 is never read again. It is released (unref'd) and its entry in the block table
becomes -1; the table keeps its length so block i still covers tokens [i*bs, (i+1)*bs). Prefix
caching of released blocks: a released block that was published (full and computed) keeps its
digest and goes to the free list as an evictable cached block, exactly like the blocks of a
finished sequence, so a later request with the same prefix can revive it. A prefix hit of k blocks
only needs the blocks the window at its end reads (plus always the last one, so every hit is
anchored on a verified block): blocks before that are entered as -1 and never revived, and their
eviction does not shorten the hit (the chained digest of the blocks found still vouches for every
token before them). Shared blocks are only ever unref'd, so releasing one never takes it from
another sequence.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Sequence as Seq

import numpy as np

from lantern.app.engine.sequence import Sequence


def hash_block(parent: bytes | None, tokens: Seq[int], salt: bytes = b"") -> bytes:
    """Chained SHA-256: a block's identity is its tokens, everything before it and the cache
    salt (tenant + request salt). A collision-resistant digest, so no caller can craft a prompt
    whose blocks alias another's."""
    h = hashlib.sha256()
    h.update(parent or b"\0" * 32)
    h.update(len(salt).to_bytes(4, "little"))
    h.update(salt)
    h.update(np.asarray(tokens, dtype=np.int64).tobytes())
    return h.digest()


class BlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        prefer_touched: bool = False,
        cache_budget_blocks: int = 0,
        release_window: int | None = None,
    ):
        """prefer_touched: the backend's pool is committed lazily (a CPU allocation is backed by
        memory only where written), so blocks used before are handed out before ever-unused
        ones, and cached prefixes are kept in at most `cache_budget_blocks` free blocks (beyond
        that the least recently freed is evicted rather than a new block touched): memory then
        follows the peak load plus that budget, not the pool's size. Off on devices whose pool
        is committed up front, where every block is kept cached until it is needed.

        release_window: the widest attention window when every layer slides (None: some layer
        reads the whole context, nothing is released)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be >= 1")
        if release_window is not None and release_window < 1:
            raise ValueError("release_window must be >= 1")
        self.release_window = release_window
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.block_tokens: list[tuple[int, ...] | None] = [None] * num_blocks  # checked on every hit
        self.prefer_touched = prefer_touched
        self.cache_budget_blocks = cache_budget_blocks
        # Freed blocks (uncached ones at the front, cached ones in LRU order behind them) and
        # blocks never handed out (popped lowest id first).
        self.free: OrderedDict[int, None] = OrderedDict()
        self.fresh: list[int] = list(range(num_blocks - 1, -1, -1))
        self.cached: dict[bytes, int] = {}  # digest -> block id
        self.prefix_queries = 0  # prompt tokens looked up in the prefix cache
        self.prefix_hits = 0  # of those, tokens found cached

    # ---- queries -------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free) + len(self.fresh)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - self.num_free_blocks

    @property
    def usage(self) -> float:
        return self.num_used_blocks / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def _update_hashes(self, seq: Sequence) -> None:
        bs = self.block_size
        while (len(seq.block_hashes) + 1) * bs <= seq.num_tokens:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(hash_block(parent, seq.tokens_range(i * bs, (i + 1) * bs), seq.cache_salt))

    def digest(self, seq: Sequence, index: int) -> bytes:
        """The chained digest of seq's full block `index`."""
        self._update_hashes(seq)
        return seq.block_hashes[index]

    def first_needed_block(self, num_computed: int) -> int:
        """Index of the first block that queries at positions >= num_computed can still read."""
        if self.release_window is None:
            return 0
        return max(0, (num_computed - self.release_window + 1) // self.block_size)

    def find_cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids holding a cached prefix of seq (never all of it: one token must be computed).
        With a release window, entries before the window of the first computed token are -1."""
        if not self.enable_prefix_caching:
            return []
        self._update_hashes(seq)
        bs = self.block_size
        max_blocks = (seq.num_tokens - 1) // bs
        hits: list[int] = []  # hits[i]: block holding block i of seq, or -1 where none is cached
        best, run_start = 0, 0  # longest valid hit so far; first block of the current run of hits
        for i, h in enumerate(seq.block_hashes[:max_blocks]):
            block = self.cached.get(h)
            if block is None or self.block_tokens[block] != tuple(seq.tokens_range(i * bs, (i + 1) * bs)):
                if self.release_window is None:
                    break
                hits.append(-1)
                run_start = i + 1
                continue
            hits.append(block)
            if min(self.first_needed_block((i + 1) * bs), i) >= run_start:
                best = i + 1  # every block the window at this point reads is cached
        lo = min(self.first_needed_block(best * bs), max(best - 1, 0))
        return [-1] * lo + hits[lo:best]

    def record_lookup(self, num_tokens: int, num_hit_tokens: int) -> None:
        self.prefix_queries += num_tokens
        self.prefix_hits += num_hit_tokens

    def blocks_needed(self, seq: Sequence, num_tokens: int, cached: Seq[int] = ()) -> int:
        """Free blocks consumed to give seq room for num_tokens (reviving cached ones counts too)."""
        new = max(self.blocks_for(num_tokens) - len(seq.block_table) - len(cached), 0)
        return new + sum(1 for b in cached if b >= 0 and self.ref_counts[b] == 0)

    def can_allocate(self, num_blocks: int, reserve: int = 0) -> bool:
        return self.num_free_blocks - num_blocks >= reserve

    # ---- mutations -----------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_tokens: int, cached: Seq[int] = ()) -> None:
        """Extend seq's block table so it covers num_tokens slots, first with cached blocks
        (-1 entries of `cached` lie before the window and stay unallocated)."""
        for block in cached:
            if block < 0:
                seq.num_released_blocks += 1
            else:
                self._ref(block)
            seq.block_table.append(block)
        while len(seq.block_table) * self.block_size < num_tokens:
            seq.block_table.append(self._take_free())

    def free_seq(self, seq: Sequence) -> None:
        # Reverse order: a prefix's tail is evicted before its head, which more requests share.
        for block in reversed(seq.block_table):
            if block >= 0:
                self._unref(block)
        seq.block_table = []
        seq.num_registered_blocks = 0
        seq.num_released_blocks = 0

    def release_behind_window(self, seq: Sequence) -> int:
        """Return seq's blocks that no future query reads to the pool (entries become -1);
        call after register_computed so full blocks keep their digest. Returns how many."""
        end = min(self.first_needed_block(seq.num_computed_tokens), len(seq.block_table))
        released = 0
        for i in range(seq.num_released_blocks, end):
            block = seq.block_table[i]
            if block >= 0:
                seq.block_table[i] = -1
                self._unref(block)
                released += 1
        seq.num_released_blocks = max(seq.num_released_blocks, end)
        return released

    def register_computed(self, seq: Sequence) -> None:
        """Publish the digests of seq's blocks that are now full and computed."""
        if not self.enable_prefix_caching:
            return
        bs = self.block_size
        n_full = min(seq.num_computed_tokens // bs, len(seq.block_table))
        if n_full <= seq.num_registered_blocks:
            return
        self._update_hashes(seq)
        for i in range(seq.num_registered_blocks, n_full):
            block, h = seq.block_table[i], seq.block_hashes[i]
            if block >= 0 and self.block_hash[block] is None and h not in self.cached:
                self.cached[h] = block
                self.block_hash[block] = h
                self.block_tokens[block] = tuple(seq.tokens_range(i * bs, (i + 1) * bs))
        seq.num_registered_blocks = n_full

    def reset_prefix_cache(self) -> None:
        for block in list(self.cached.values()):
            self.block_hash[block] = None
            self.block_tokens[block] = None
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

    def _reuse_first(self) -> bool:
        """On a lazy pool: reuse a freed block (rather than touch a new one) when one holds no
        cached prefix, or when the cached ones are over their budget."""
        if not self.free:
            return False
        front = next(iter(self.free))  # uncached blocks sit at the front
        return self.block_hash[front] is None or len(self.free) >= self.cache_budget_blocks

    def _take_free(self) -> int:
        if self.fresh and not (self.prefer_touched and self._reuse_first()):
            block = self.fresh.pop()
            self.ref_counts[block] = 1
            return block
        if not self.free:
            raise RuntimeError("out of KV blocks (the scheduler should have checked)")
        block, _ = self.free.popitem(last=False)
        h = self.block_hash[block]
        if h is not None:
            if self.cached.get(h) == block:
                del self.cached[h]
            self.block_hash[block] = None
            self.block_tokens[block] = None
        self.ref_counts[block] = 1
        return block
