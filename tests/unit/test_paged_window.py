"""Sliding windows, logit soft-capping and attention sinks in both backends' paged attention,
against dense attention written out here in float64 numpy (transformers' eager maths: scores *
scale, soft-cap, mask p - window < j <= p, sinks as an extra logit in the denominator only).

Three steps through a paged pool with block size 4 (smaller than the windows): prefills without a
prefix; then decodes mixed with a chunk that reads its prefix back from the pool; then decodes
whose block tables hold -1 where the engine released blocks wholly before every layer's window
(those physical blocks, and block 0 the plan maps -1 to, are overwritten with huge values).
"""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from lantern.app.engine.contract import ScheduledBatch
from lantern.backends.paged_plan import plan_attention

BS, NUM_BLOCKS, HEADS, KVH, D, SCALE = 4, 48, 4, 2, 8, 0.35
POISON = 1e3
BACKENDS = [
    pytest.param(b, marks=pytest.mark.skipif(importlib.util.find_spec(m) is None, reason=f"{b} not installed"))
    for b, m in (("torch", "torch"), ("mlx", "mlx"))
]


def dense_attention(q, keys, values, positions, window, softcap, sinks):
    """q [n, H, D] at `positions`, keys/values [L, KVH, D] by position -> [n, H, D] (float64)."""
    out = np.zeros(q.shape)
    group = HEADS // KVH
    for i, p in enumerate(positions):
        j = np.arange(p + 1)
        if window is not None:
            j = j[j > p - window]
        for h in range(HEADS):
            s = keys[j, h // group] @ q[i, h] * SCALE
            if softcap is not None:
                s = softcap * np.tanh(s / softcap)
            m = s.max() if sinks is None else max(s.max(), sinks[h])
            e = np.exp(s - m)
            denom = e.sum() + (0.0 if sinks is None else np.exp(sinks[h] - m))
            out[i, h] = e @ values[j, h // group] / denom
    return out


class Backend:
    """One backend's pool and paged_attention, driven with numpy arrays."""

    def __init__(self, name: str, num_layers: int):
        self.name = name
        if name == "mlx":
            import mlx.core as mx

            from lantern.backends.mlx import paged_attention as pa

            self.mx, self.pa = mx, pa
            self.pool = pa.PagedKVPool(num_layers, NUM_BLOCKS * BS, KVH, D, mx.float32, block_size=BS)
        else:
            import torch

            from lantern.backends.torch import attention as pa

            self.torch, self.pa = torch, pa
            self.pool = pa.TorchKVPool(num_layers, NUM_BLOCKS * BS, KVH, D, torch.float32, torch.device("cpu"))

    def meta(self, batch: ScheduledBatch):
        plan = plan_attention(batch)
        if self.name == "mlx":
            return self.pa.build_metadata(self.pool, batch, plan)
        table = self.torch.zeros(256, D)
        return self.pa.build_metadata(self.pool, batch, plan, table, table)

    def attend(self, meta, layer, q, k, v, window, softcap, sinks):
        if self.name == "mlx":
            a = self.mx.array
            s = None if sinks is None else a(sinks.astype(np.float32))
            out = self.pa.paged_attention(a(q), a(k), a(v), meta, layer, SCALE, window, softcap, s)
            return np.array(out)
        t = lambda x: self.torch.from_numpy(x.astype(np.float32))
        s = None if sinks is None else t(sinks)
        return self.pa.paged_attention(t(q), t(k), t(v), meta, layer, SCALE, window, softcap, s).numpy()

    def poison(self, layer: int, block: int) -> None:
        """Overwrite one physical block (as if handed to another sequence) with huge values."""
        rows = slice(block * BS, (block + 1) * BS)
        self.pool.k[layer][rows] = POISON  # in place for both: torch tensors, MLX arrays
        self.pool.v[layer][rows] = POISON


def make_batch(pieces, tables):
    """pieces: (seq, first position, number of tokens, context length after the step)."""
    positions = np.concatenate([np.arange(p, p + n) for _, p, n, _ in pieces]).astype(np.int32)
    starts = np.concatenate([[0], np.cumsum([n for _, _, n, _ in pieces])]).astype(np.int32)
    bts = [list(tables[s]) for s, _, _, _ in pieces]
    slots = np.concatenate(
        [np.array(tables[s])[np.arange(p, p + n) // BS] * BS + np.arange(p, p + n) % BS for s, p, n, _ in pieces]
    )
    return ScheduledBatch(
        input_ids=np.zeros(len(positions), np.int32),
        positions=positions,
        query_start_loc=starts,
        seq_lens=np.array([c for _, _, _, c in pieces], np.int32),
        block_tables=bts,
        slot_mapping=slots.astype(np.int32),
        block_size=BS,
        sample_seq_indices=[],
        sampling=[],
    )


CASES = {
    # per-layer windows, softcap, sinks
    "windows": ([6, 3], None, False),  # every layer slides: released blocks appear
    "window_and_full": ([5, None], None, False),  # the interleaved local/global pattern
    "softcap": ([None, None], 2.0, False),
    "sinks": ([None, None], None, True),
    "all": ([7, 9], 2.0, True),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_paged_attention_matches_dense_attention(backend, case):
    windows, softcap, with_sinks = CASES[case]
    rng = np.random.default_rng(0)
    lengths = {"a": 27, "b": 19, "c": 22}  # tokens each sequence will have after step 3
    blocks = rng.permutation(np.arange(1, NUM_BLOCKS))  # block 0 is never handed out
    tables, used = {}, 0
    for s, n in lengths.items():
        tables[s] = [int(b) for b in blocks[used : used + -(-n // BS)]]
        used += len(tables[s])
    kv = {(s, layer): rng.standard_normal((2, n, KVH, D)) for s, n in lengths.items() for layer in range(2)}
    sinks = rng.standard_normal(HEADS) * 2 if with_sinks else None
    be = Backend(backend, num_layers=2)
    # step 1: three prefills from position 0; step 2: decodes around a chunk with a prefix;
    # step 3: decodes only, over tables with released blocks.
    steps = [
        [("a", 0, 10, 10), ("b", 0, 13, 13), ("c", 0, 17, 17)],
        [("b", 13, 1, 14), ("a", 10, 16, 26), ("c", 17, 1, 18)],
        [("a", 26, 1, 27), ("b", 14, 1, 15), ("c", 18, 1, 19)],
    ]
    released = 0
    for step, pieces in enumerate(steps):
        if step == 2 and all(w is not None for w in windows):
            for s, p, _, _ in pieces:  # blocks wholly before the widest window of the next query
                for i in range((p - max(windows) + 1) // BS):
                    for layer in range(2):
                        be.poison(layer, tables[s][i])
                    tables[s][i] = -1
                    released += 1
            for layer in range(2):
                be.poison(layer, 0)
        batch = make_batch(pieces, tables)
        meta = be.meta(batch)
        for layer, window in enumerate(windows):
            q = rng.standard_normal((batch.num_tokens, HEADS, D))
            k = np.concatenate([kv[s, layer][0, p : p + n] for s, p, n, _ in pieces])
            v = np.concatenate([kv[s, layer][1, p : p + n] for s, p, n, _ in pieces])
            ours = be.attend(meta, layer, q, k, v, window, softcap, sinks)
            row = 0
            for s, p, n, _ in pieces:
                keys, values = kv[s, layer][0], kv[s, layer][1]
                ref = dense_attention(q[row : row + n], keys, values, range(p, p + n), window, softcap, sinks)
                np.testing.assert_allclose(ours[row : row + n], ref, atol=2e-5, rtol=1e-4, err_msg=f"{s} step {step}")
                row += n
    if case == "windows":
        assert released >= 4  # the -1 entries were really exercised


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_window_changes_the_result(backend):
    """Guard against a reference that ignores the window: past it, the outputs differ."""
    rng = np.random.default_rng(1)
    be = Backend(backend, num_layers=1)
    table = [int(b) for b in rng.permutation(np.arange(1, NUM_BLOCKS))[:4]]
    batch = make_batch([("a", 0, 14, 14)], {"a": table})
    q, k, v = (rng.standard_normal((14, h, D)) for h in (HEADS, KVH, KVH))
    windowed = be.attend(be.meta(batch), 0, q, k, v, 4, None, None)
    full = dense_attention(q, k, v, range(14), None, None, None)
    np.testing.assert_allclose(windowed[:4], full[:4], atol=2e-5)  # inside the window: the same
    assert not np.allclose(windowed[8:], full[8:], atol=1e-3)


def test_plan_maps_released_blocks_to_block_zero():
    tables = {"a": [-1, -1, 7, 9, 11], "b": [3, 4]}
    batch = make_batch([("a", 18, 1, 19), ("b", 5, 2, 7)], tables)
    plan = plan_attention(batch)
    assert plan.decode_block_tables.tolist() == [[0, 0, 7, 9, 11]]
    assert plan.prefills[0].first_pos == 5 and plan.prefills[0].context_slots.min() >= 0
