"""Prefix caching for models with recurrent layers: snapshots of the recurrent state at block boundaries.

A cached prefix restores the attention layers' K/V from the block pool, but a recurrent layer (linear
attention, a short convolution, a Mamba mixer) folds every token before it into one state per sequence,
which the blocks do not hold. So the state at a block boundary is copied into a snapshot slot of the
backend's state arrays, keyed by the chained digest of the block ending there (BlockManager.hash_block:
the tokens before it and the cache salt, so tenants never see each other's snapshots). A later prompt
whose blocks are cached up to a boundary that has a snapshot starts there: its K/V from the pool, its
state copied from the snapshot into its own slot.

Where snapshots are taken (`checkpoints`): a prompt's chunked prefill is cut so that a chunk ends at
 - the prompt's last block boundary that another request can start from (a follow-up turn that extends
   this prompt, the same prompt again, or the other samples of an n > 1 request), and
 - the end of the cached blocks it shares with an earlier prompt, where no snapshot was yet (two
   conversations over one long system prompt: the second one leaves a snapshot at the point where
   they part, and every later one starts there).
While a sequence decodes, it keeps one more snapshot of its own, moved to each block boundary it reaches
(`StateCache.move`: the same slot under the new block's digest), so a follow-up turn whose prompt repeats the
reply (a chat turn, an agent's tool call) starts at most a block short of the reply's end instead of
recomputing it. At most half the snapshot slots are held so by running sequences at once (the others keep
the prompt snapshots); a finished sequence's last one stays in the cache like any other.
Snapshots are evicted least recently used first; one whose blocks were evicted simply stops matching.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence as Seq
from typing import NamedTuple


class Snapshot(NamedTuple):
    """A snapshot of a recurrent state: the digest of the block it ends with, its slot, the tokens it covers."""

    digest: bytes
    slot: int
    tokens: int


class StateCache:
    """Snapshot slots `first .. first + count - 1` of the backend's state arrays, by block digest."""

    def __init__(self, first: int, count: int):
        if count < 1:
            raise ValueError("a state cache needs at least one snapshot slot")
        self.first, self.count = first, count
        self.slots: OrderedDict[bytes, int] = OrderedDict()  # digest -> slot, least recently used first
        self.fresh = list(range(first + count - 1, first - 1, -1))  # never used, popped lowest first
        self.restores = 0  # prompts that started from a snapshot
        self.saves = 0  # snapshots taken

    def longest(self, digests: Seq[bytes]) -> tuple[int, int | None]:
        """(k, slot): the most leading blocks of `digests` whose end has a snapshot, and its slot
        ((0, None) when none has); the snapshot found becomes the most recently used."""
        for k in range(len(digests), 0, -1):
            slot = self.slots.get(digests[k - 1])
            if slot is not None:
                self.slots.move_to_end(digests[k - 1])
                return k, slot
        return 0, None

    def holds(self, snapshot: Snapshot) -> bool:
        """Whether that snapshot is still in its slot (not evicted)."""
        return self.slots.get(snapshot.digest) == snapshot.slot

    def move(self, snapshot: Snapshot, digest: bytes, tokens: int) -> Snapshot | None:
        """A snapshot held in `snapshot`'s slot moved to `digest` (the state now copied there covers `tokens`),
        the most recently used; None when that slot has been evicted, or `digest` has a snapshot already."""
        if not self.holds(snapshot) or digest in self.slots:
            return None
        del self.slots[snapshot.digest]
        self.slots[digest] = snapshot.slot
        self.saves += 1
        return Snapshot(digest, snapshot.slot, tokens)

    def store(self, digest: bytes) -> int | None:
        """The slot to copy the state ending at `digest` into (evicting the least recently used
        snapshot when all are taken); None when that snapshot exists already."""
        if digest in self.slots:
            self.slots.move_to_end(digest)
            return None
        slot = self.fresh.pop() if self.fresh else self.slots.popitem(last=False)[1]
        self.slots[digest] = slot
        self.saves += 1
        return slot


def checkpoints(num_prompt_tokens: int, start: int, shared: int, block_size: int) -> list[int]:
    """Where a prompt starting at token `start` (restored from a snapshot, or 0) is cut so that a
    snapshot can be taken: the end of its `shared` cached leading tokens (when past `start`), and its
    last block boundary short of the prompt's end (a cached prefix always leaves one token to compute)."""
    last = (num_prompt_tokens - 1) // block_size * block_size
    return sorted({c for c in (shared, last) if c > start})
