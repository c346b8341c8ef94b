"""How long a context the engine serves and how many KV blocks it asks the backend for.

The pool is sized by need, not by the machine: room for `max_num_seqs` sequences of a default
context (DEFAULT_TOKENS_PER_SEQ, or the model's context if shorter), never less than one
full-length sequence, capped by a share of the memory left after the weights. On a CPU the pool
is committed lazily (only blocks that were written use memory) and the block manager reuses
written blocks first, so resident memory follows the load.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from lantern.app.config import EngineConfig
from lantern.app.models.spec import check_servable

logger = logging.getLogger(__name__)

DEFAULT_TOKENS_PER_SEQ = 2048
# On a lazily committed pool, free blocks kept only for their cached prefix may hold this much
# memory (beyond it the oldest is evicted instead of a new block being touched).
PREFIX_CACHE_BUDGET_BYTES = 256 * 2**20
# Recurrent-state snapshots for prefix caching (app/engine/state_cache.py) take up to this much by default,
# and at least two (one conversation's latest turn and a shared system prompt) where one is larger.
PREFIX_STATE_BUDGET_BYTES = 512 * 2**20
MIN_STATE_SNAPSHOTS = 2


@dataclass
class KVPlan:
    num_blocks: int
    max_model_len: int
    cache_budget_blocks: int = 0  # see PREFIX_CACHE_BUDGET_BYTES; 0 where the pool is not lazy
    max_num_seqs: int = 0  # sequences that may run at once (lowered where a recurrent state takes the memory)
    state_snapshots: int = 0  # recurrent-state snapshot slots for prefix caching (0: none, or no recurrent state)


def plan_kv_cache(config: EngineConfig, model_config: Any, model_max: int, backend: Any) -> KVPlan:
    max_len = config.max_model_len or model_max
    check_servable(model_config, max_len)  # past the rope's positions, or dual chunk attention past a chunk
    bs = config.block_size
    # (0: no layer keeps K/V, as a Mamba model's: blocks only count tokens, and cost nothing)
    per_block = backend.kv_bytes_per_block(bs)
    unit = max(per_block, 1)
    share = int(backend.available_memory_bytes() * config.gpu_memory_fraction)
    per_seq = backend.state_bytes_per_seq()
    max_seqs, snapshots = state_slots(config, per_seq, share)
    state_bytes = per_seq * (max_seqs + snapshots)
    blocks_for = lambda tokens: -(-tokens // bs)
    held = seq_block_cap(config, model_config)
    longest = blocks_for(max_len) if held is None else min(blocks_for(max_len), held)  # one full-length sequence
    if config.num_kv_blocks:
        num, why = config.num_kv_blocks, "num_kv_blocks"
    elif config.kv_cache_memory_mb and per_block:
        num, why = config.kv_cache_memory_mb * 2**20 // per_block, "--mem"
        if num < 1:
            raise ValueError(
                f"--mem {config.kv_cache_memory_mb} MiB holds no KV block ({per_block / 2**20:.2f} MiB "
                f"each for {bs} tokens); give more"
            )
    else:
        seq_tokens = min(max_len, DEFAULT_TOKENS_PER_SEQ)
        if held is None:
            need = blocks_for(max(max_len, max_seqs * seq_tokens))
            room = f"{seq_tokens} tokens"
        else:
            need = max(longest, max_seqs * min(blocks_for(seq_tokens), held))
            room = f"{min(blocks_for(seq_tokens), held)} blocks"
        cap = max(share - state_bytes, 0) // unit if per_block else need  # the recurrent state sits beside the pool
        num = max(min(need, cap), 1)
        why = (
            f"room for {max_seqs} sequences of {room}"
            if num == need
            else f"capped at {config.gpu_memory_fraction:.0%} of free memory"
        )
    if longest > num:
        if config.max_model_len is not None:
            raise ValueError(
                f"--max-model-len {max_len} does not fit the KV cache ({num * bs} tokens); "
                "give --mem more MiB or a shorter --max-model-len"
            )
        logger.warning(
            "context capped at the KV cache's %d tokens (model: %d); give --mem more MiB for more", num * bs, max_len
        )
        max_len = num * bs
    budget = min(num, max(PREFIX_CACHE_BUDGET_BYTES // unit, 1)) if backend.kv_memory_is_lazy else 0
    logger.info(
        "KV cache: %d blocks x %d tokens = %d tokens, %.1f MiB (%s)%s; context %d tokens",
        num,
        bs,
        num * bs,
        num * per_block / 2**20,
        why,
        f", committed as used, prefix cache kept in up to {budget * per_block / 2**20:.0f} MiB of free blocks"
        if budget
        else "",
        max_len,
    )
    if held is not None and held < blocks_for(max_len):
        logger.info(
            "every layer slides (window %d tokens): blocks behind it go back to the pool, so a sequence "
            "holds at most %d blocks (window + the block being written + a %d-token prefill chunk) "
            "and its context is not limited by the pool's %d blocks",
            model_config.sliding_window,
            held,
            _step_tokens(config),
            num,
        )
    return KVPlan(
        num_blocks=num,
        max_model_len=max_len,
        cache_budget_blocks=budget,
        max_num_seqs=max_seqs,
        state_snapshots=snapshots,
    )


def state_slots(config: EngineConfig, per_seq: int, share: int) -> tuple[int, int]:
    """(sequences, snapshots) for a model whose sequences each hold `per_seq` bytes of recurrent state
    (linear attention, short convolutions, Mamba mixers): max_num_seqs running sequences and, with prefix
    caching, --prefix-cache-states snapshots of that state (by default as many as PREFIX_STATE_BUDGET_BYTES
    holds, at least MIN_STATE_SNAPSHOTS, at most max_num_seqs), lowered so that all of it takes at most half
    of the memory share (the KV pool needs the rest; where both do not fit, the snapshots get at most half
    of the room); refused when not even one sequence's state fits. (max_num_seqs, 0) without such a state."""
    if not per_seq:
        return config.max_num_seqs, 0
    fit = share // 2 // per_seq
    if fit < 1:
        raise ValueError(
            f"one sequence's recurrent state ({per_seq / 2**20:.0f} MiB, the recurrent layers') does not "
            f"fit in half of the {share / 2**20:.0f} MiB this engine may use; raise --gpu-memory-fraction"
        )
    snapshots = 0
    if config.enable_prefix_caching:
        want = config.prefix_cache_states
        if want is None:
            want = min(config.max_num_seqs, max(MIN_STATE_SNAPSHOTS, PREFIX_STATE_BUDGET_BYTES // per_seq))
        snapshots = want if config.max_num_seqs + want <= fit else min(want, fit // 2)
        if snapshots < want and config.prefix_cache_states is not None:
            logger.warning(
                "--prefix-cache-states lowered from %d to %d: the recurrent state may take half of the %.0f MiB "
                "this engine may use",
                want,
                snapshots,
                share / 2**20,
            )
    seqs = min(config.max_num_seqs, fit - snapshots)
    if seqs < config.max_num_seqs:
        logger.warning(
            "max_num_seqs lowered from %d to %d: each sequence's recurrent state takes %.1f MiB and the state%s "
            "may take half of the %.0f MiB this engine may use (--max-num-seqs %d to choose)",
            config.max_num_seqs,
            seqs,
            per_seq / 2**20,
            f" (with {snapshots} prefix-cache snapshots of it: --prefix-cache-states)" if snapshots else "",
            share / 2**20,
            seqs,
        )
    logger.info(
        "recurrent state: %.1f MiB for %d sequences (%.2f MiB each, the recurrent layers')%s",
        per_seq * seqs / 2**20,
        seqs,
        per_seq / 2**20,
        f", and {per_seq * snapshots / 2**20:.1f} MiB for {snapshots} prefix-cache snapshots of it"
        if snapshots
        else "",
    )
    return seqs, snapshots


def _step_tokens(config: EngineConfig) -> int:
    """Most tokens one sequence computes in a step (scheduler: a prefill chunk within the budget; the
    engine sets the budget before it plans, an unset one bounds nothing here)."""
    return max(1, min(config.prefill_chunk_size, config.max_num_batched_tokens or config.prefill_chunk_size))


def seq_block_cap(config: EngineConfig, model_config: Any) -> int | None:
    """Most KV blocks one sequence ever holds when every layer slides; None when some layer reads
    the whole context (or the window is a single token, see below).

    After each step the blocks wholly before the next query's window are released
    (BlockManager.release_behind_window): with window W, block size bs, n tokens computed and a
    step computing c more, the sequence holds blocks floor((n - W + 1) / bs) to
    ceil((n + c) / bs) - 1. Over every n a schedule can reach (a chunk may start at any position:
    the token budget cuts chunks short; a prefix hit starts at a block boundary and revives only
    the blocks its window reads) and c up to C = _step_tokens, the most is exactly
    1 + ceil((W + C - 2) / bs) — reached when n - W + 1 is one short of a block boundary. With W = 1
    a prefix hit keeps one block more than its window (the block anchoring the hit): no cap.
    """
    window = model_config.sliding_window if getattr(model_config, "all_layers_slide", False) else None
    if window is None or window < 2:
        return None
    bs = config.block_size
    return 1 + -(-(window + _step_tokens(config) - 2) // bs)
