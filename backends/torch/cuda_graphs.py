"""Decode steps as CUDA graphs: one graph per batch-size bucket, captured at start-up, replayed.

A decode-only step of n sequences runs the graph of the smallest bucket >= n. Its inputs are
copied into static buffers; rows n.. are padding (slot -1 writes nothing, a length of 1 over
block 0 reads finite values, under any window) and only the first n rows of logits are returned.
Sliding windows, soft-caps and sinks are per-layer constants, so the captured kernels carry them. Prefill and
mixed steps, and batches larger than the largest bucket, run eagerly.

Replaying one graph replaces hundreds of kernel launches per step (a 32-layer model launches
~15 per layer), which is what bounds small-batch decode on a GPU once the kernels themselves
are fast. With `capture=False` (no CUDA) the same static-buffer path runs eagerly: that is how
the padding logic is tested on a CPU.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from lantern.app.engine.contract import ScheduledBatch
from lantern.backends.torch.attention import TorchAttentionMetadata, TorchKVPool
from lantern.backends.torch.kernels import pdl

logger = logging.getLogger(__name__)

MAX_CAPTURE_SIZE = 512  # vLLM's default largest captured batch
_WHOLE_TABLE_ROWS = 1 << 16  # table entries copied as whole rows at most (256 KB): above, the step's columns only


def take_carried(ids: torch.Tensor, carried: torch.Tensor, tokens: torch.Tensor) -> None:
    """ids[i] = tokens[carried[i]] where carried[i] >= 0, in place on the device (ScheduledBatch.carried)."""
    picked = tokens[carried.clamp(min=0)].to(ids.dtype)
    ids.copy_(torch.where(carried >= 0, picked, ids))


def batch_buckets(max_size: int) -> list[int]:
    """1, 2, 4, then every multiple of 8 up to the first that holds max_size."""
    small = [s for s in (1, 2, 4) if s < max_size]
    return small + list(range(8, max_size + 8, 8)) if max_size > 4 else small + [max_size]


class DecodeGraphRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        pool: TorchKVPool,
        cos: torch.Tensor,
        sin: torch.Tensor,
        block_size: int,
        max_blocks_per_seq: int,
        max_batch: int = MAX_CAPTURE_SIZE,
        capture: bool = True,
    ) -> None:
        self.model, self.pool, self.cos, self.sin = model, pool, cos, sin
        self.block_size = block_size
        self.max_blocks = max_blocks_per_seq
        self.buckets = batch_buckets(max_batch)
        self.capture = capture
        size, dev = self.buckets[-1], cos.device
        # Host staging and the device buffers the graphs read, one pair per dtype: ids, positions and slots (int64),
        # then the lengths and the block tables (int32) -- two copies a step, not five, asynchronous from pinned
        # memory on CUDA (a copy from pageable memory waits for the stream and stages through the driver).
        pin = dev.type == "cuda"
        # Two sets of host staging, used in turn: with steps scheduled ahead (app/engine/step_ahead.py) the host
        # fills step N+1's while step N's copies may still be queued; step N-1's, whose tokens were read, are done.
        # Row 3 of the int64 staging: the carried rows (take_carried).
        self.h_long = [torch.zeros((4, size), dtype=torch.long, pin_memory=pin) for _ in range(2)]
        self.h_int = [torch.zeros(size * (1 + max_blocks_per_seq), dtype=torch.int32, pin_memory=pin) for _ in range(2)]
        for h_long, h_int in zip(self.h_long, self.h_int, strict=True):
            h_long[2].fill_(-1)
            h_int[:size].fill_(1)
        self.turn = 0
        self.d_long = self.h_long[0].to(dev, copy=True)  # (copy: on a CPU too, so that the copies are tested there)
        self.d_int = self.h_int[0].to(dev, copy=True)
        self.ids, self.positions, self.slots, self.carried = (self.d_long[i] for i in range(4))
        self.lens = self.d_int[:size]
        self.tables = self.d_int[size:].view(size, max_blocks_per_seq)
        self.rows = torch.arange(size, device=dev)
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.mempool = None

    def supports(self, batch: ScheduledBatch) -> bool:
        n = batch.num_seqs
        return (
            0 < n <= self.buckets[-1]
            and batch.num_tokens == n  # every sequence decodes one token
            and len(batch.sample_seq_indices) == n
            and not batch.prompt_rows  # (logits of sampled rows only)
            and max(len(t) for t in batch.block_tables) <= self.max_blocks
        )

    def run(self, batch: ScheduledBatch, carried: tuple[np.ndarray, torch.Tensor] | None = None) -> torch.Tensor:
        """Float32 logits [n, vocab] of a decode-only batch (see supports()). carried: the batch's carried rows and
        the earlier step's device tokens they index (ScheduledBatch.carried), taken into the ids on the device."""
        n = batch.num_seqs
        size = next(b for b in self.buckets if b >= n)
        self._fill(batch, n, size, carried)
        if not self.capture:
            return self._forward(size)[:n]
        graph, out = self.graphs[size]  # every bucket was captured at start-up (capture_all)
        graph.replay()
        return out[:n]

    def _fill(self, batch: ScheduledBatch, n: int, size: int, carried: tuple[np.ndarray, torch.Tensor] | None) -> None:
        h_long, h_int = self.h_long[self.turn], self.h_int[self.turn]
        self.turn ^= 1
        h_ids, h_pos, h_slots, h_carried = h_long.numpy()
        lens = self.lens.numel()
        h_lens, h_tables = h_int[:lens].numpy(), h_int[lens:].view(self.tables.shape).numpy()
        h_ids[:n] = batch.input_ids
        h_pos[:n] = batch.positions
        h_slots[:n] = batch.slot_mapping
        h_lens[:n] = batch.seq_lens
        # Only the columns this step can read are refreshed: a sequence reads its own blocks
        # (< its length), a padding row only block 0, so older values further right are never read.
        # Released blocks (-1, wholly before every layer's window) become block 0: the kernels
        # start at the window's first block, and mask what lies before it, so it is never used.
        width = max(len(t) for t in batch.block_tables)
        h_tables[:size, :width] = 0
        for r, table in enumerate(batch.block_tables):
            h_tables[r, : len(table)] = np.maximum(table, 0)
        h_ids[n:size], h_pos[n:size], h_slots[n:size], h_lens[n:size] = 0, 0, -1, 1
        if carried is not None:
            h_carried[:n] = carried[0]
        self.d_long.copy_(h_long, non_blocking=True)  # (a few KB: whole)
        if size * self.max_blocks <= _WHOLE_TABLE_ROWS:  # the lengths and the first `size` table rows: one run
            end = lens + size * self.max_blocks
            self.d_int[:end].copy_(h_int[:end], non_blocking=True)
        else:  # (long contexts at large batches: only the columns this step reads)
            self.d_int[:lens].copy_(h_int[:lens], non_blocking=True)
            self.tables[:size, :width].copy_(h_int[lens:].view(self.tables.shape)[:size, :width], non_blocking=True)
        if carried is not None:
            rows, tokens = carried
            if rows.min() >= 0 and n <= tokens.numel() and np.array_equal(rows, np.arange(n)):
                self.ids[:n].copy_(tokens[:n])  # (the usual case: the same sequences, in the same order)
            else:
                take_carried(self.ids[:n], self.carried[:n], tokens)

    def _forward(self, size: int) -> torch.Tensor:
        rows, pos = self.rows[:size], self.positions[:size]
        meta = TorchAttentionMetadata(
            self.pool,
            self.block_size,
            self.slots[:size],
            self.cos[pos],
            self.sin[pos],
            decode_token_idx=rows,
            decode_block_tables=self.tables[:size],
            decode_seq_lens=self.lens[:size],
            positions=pos,
            decode_only=True,
        )
        return self.model(self.ids[:size], meta, rows).float()

    def capture_all(self) -> bool:
        """Capture every bucket now, before the engine serves: a first request of each batch size
        must not wait for its capture (nor a benchmark count it). The buffers hold padding rows
        only (slot -1: nothing written). False, with a warning, if a capture fails: the caller then
        runs decode steps eagerly."""
        t0 = time.perf_counter()
        try:
            for size in self.buckets:
                self._capture(size)
        except RuntimeError as exc:
            self.graphs.clear()
            # A driver refusing PDL launches in a capture (seen on sm_120): once more, every kernel launched plainly.
            if pdl.enabled(self.cos) and pdl.turn_off(f"decode CUDA graphs could not be captured with it ({exc})"):
                return self.capture_all()
            logger.warning("decode CUDA graphs could not be captured (%s); decode steps run eagerly", exc)
            return False
        logger.info(
            "captured %d decode CUDA graphs (batch 1..%d) in %.1f s",
            len(self.buckets),
            self.buckets[-1],
            time.perf_counter() - t0,
        )
        return True

    def _capture(self, size: int) -> None:
        t0 = time.perf_counter()
        # Warm-up off the default stream compiles the Triton kernels and settles the allocator.
        # It writes this step's K/V, which the replay then writes again with the same values.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._forward(size)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.mempool):
            out = self._forward(size)
        self.mempool = graph.pool()  # all buckets share one memory pool
        self.graphs[size] = (graph, out)
        logger.debug(
            "captured the decode CUDA graph for batch size %d in %.0f ms", size, (time.perf_counter() - t0) * 1e3
        )
