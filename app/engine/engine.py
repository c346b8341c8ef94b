"""The synchronous engine (`LLMEngine.step`) and the offline `LLM` API on top of it."""
from __future__ import annotations

import logging
import random
import time
import uuid
from typing import Any, Sequence as Seq

from app.config import EngineConfig
from app.engine.batch import build_batch
from app.engine.block_manager import BlockManager
from app.engine.metrics import EngineStats
from app.engine.output_processor import OutputProcessor, RequestState
from app.engine.request import RequestOutput
from app.engine.sampling_params import SamplingParams
from app.engine.scheduler import Scheduler, SchedulerConfig
from app.engine.sequence import Sequence, TokenLogprob
from app.models.loader import resolve_model

logger = logging.getLogger(__name__)

Prompt = str | list[int]


class LLMEngine:
    def __init__(self, config: EngineConfig, backend: Any = None):
        from backends import create_backend, default_dtype, pick_backend  # the only place the core meets a backend

        self.config = config
        backend_name = pick_backend(config.backend) if backend is None else backend.name
        dtype = config.dtype if config.dtype != "auto" else default_dtype(backend_name)
        t0 = time.monotonic()
        loaded = resolve_model(config.model, dtype)
        self.model_name = loaded.spec.name
        self.model_config = loaded.spec.config
        self.tokenizer = loaded.tokenizer
        self.chat_template = config.chat_template or loaded.chat_template
        self.eos_token_ids = loaded.eos_token_ids
        self.backend = backend or create_backend(backend_name, config.tensor_parallel_size, config.enforce_eager)
        info = self.backend.load(loaded.spec)
        logger.info(
            "loaded %s on %s (%s): %.1fM parameters, %.1f MiB of weights in %.1fs",
            self.model_name, self.backend.name, dtype, info.num_params / 1e6,
            info.weight_bytes / 2**20, time.monotonic() - t0,
        )
        self.vocab_size = info.vocab_size
        bs = config.block_size
        max_len = config.max_model_len or info.max_model_len
        num_blocks = self._num_kv_blocks(bs, max_len)
        if max_len > num_blocks * bs:
            logger.warning("max_model_len %d exceeds the KV pool (%d tokens); capping", max_len, num_blocks * bs)
            max_len = num_blocks * bs
        self.max_model_len = max_len
        self.backend.allocate_kv(num_blocks, bs)
        self.block_manager = BlockManager(num_blocks, bs, config.enable_prefix_caching)
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                prefill_chunk_size=config.prefill_chunk_size,
            ),
            self.block_manager,
        )
        self.outputs = OutputProcessor(self.tokenizer, self.eos_token_ids, max_len)
        self.requests: dict[str, RequestState] = {}
        self.stats = EngineStats()

    def _num_kv_blocks(self, block_size: int, max_len: int) -> int:
        per_block = self.backend.kv_bytes_per_block(block_size)
        if self.config.num_kv_blocks:
            num = self.config.num_kv_blocks
        else:
            if self.config.kv_cache_memory_mb:
                budget = self.config.kv_cache_memory_mb * 2**20
            else:
                budget = int(self.backend.available_memory_bytes() * self.config.gpu_memory_fraction)
            # More blocks than max_num_seqs full-length sequences can use is wasted memory.
            useful = self.config.max_num_seqs * -(-max_len // block_size)
            num = max(min(budget // per_block, useful), 1)
        logger.info(
            "KV cache: %d blocks x %d tokens (%.1f MiB, %d tokens in all)",
            num, block_size, num * per_block / 2**20, num * block_size,
        )
        return num

    # ---- requests ------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return list(prompt)

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if not prompt_ids:
            raise ValueError("prompt must not be empty")
        if any(not isinstance(t, int) or not 0 <= t < self.vocab_size for t in prompt_ids):
            raise ValueError(f"prompt token ids must be integers in [0, {self.vocab_size})")
        if len(prompt_ids) >= self.max_model_len:
            raise ValueError(
                f"prompt is {len(prompt_ids)} tokens; this model's context is {self.max_model_len} "
                "tokens and at least one must be left for the reply"
            )

    def add_request(
        self, request_id: str, prompt: Prompt, params: SamplingParams | None = None,
        prompt_token_ids: list[int] | None = None,
    ) -> None:
        params = params or SamplingParams()
        ids = prompt_token_ids if prompt_token_ids is not None else self.tokenize_prompt(prompt)
        self.validate(ids, params)
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in use")
        room = self.max_model_len - len(ids)
        max_tokens = min(params.max_tokens or room, room)
        base_seed = params.seed if params.seed is not None else random.getrandbits(48)
        state = RequestState(request_id, prompt if isinstance(prompt, str) else None, ids, params, max_tokens)
        seqs = [
            Sequence(request_id, ids, params, index=i, seed=base_seed + i) for i in range(params.n)
        ]
        self.outputs.track(state, seqs[0])
        state.pending_forks = seqs[1:]
        self.requests[request_id] = state
        self.scheduler.add(seqs[0])

    def abort_request(self, request_id: str) -> RequestOutput | None:
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        state.pending_forks.clear()
        for out in state.seqs:
            self.scheduler.finish(out.seq, "abort")
        return self.outputs.make_output(state)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        sched = self.scheduler.schedule()
        if not sched.scheduled:
            return []
        banned = {s.seq.seq_id: self.outputs.banned_tokens(s.seq) for s in sched.scheduled if s.samples}
        batch = build_batch(sched, self.config.block_size, banned)
        result = self.backend.execute(batch)
        self.scheduler.after_step(sched)
        self.stats.steps += 1
        now = time.monotonic()
        touched: dict[str, RequestState] = {}
        for row, seq_idx in enumerate(batch.sample_seq_indices):
            seq = sched.scheduled[seq_idx].seq
            state = self.requests[seq.request_id]
            if not seq.output_token_ids:
                self.stats.prompt_tokens += seq.num_prompt_tokens if seq.index == 0 else 0
                if state.pending_forks:
                    self._fork_siblings(state, seq)
            token = result.token_ids[row]
            if result.logprobs is not None and seq.params.logprobs is not None:
                top = dict(result.top_logprobs[row]) if result.top_logprobs else {}
                seq.output_logprobs.append(TokenLogprob(token, result.logprobs[row], top))
            out = next(o for o in state.seqs if o.seq is seq)
            reason = self.outputs.append(state, out, token)
            self.stats.generation_tokens += 1
            if state.first_token_time is None:
                state.first_token_time = now
                self.stats.ttft_s.append(now - state.arrival)
            if reason is not None:
                self.scheduler.finish(seq, reason)
            touched[state.request_id] = state
        outputs = []
        for state in touched.values():
            outputs.append(self.outputs.make_output(state))
            if state.finished:
                del self.requests[state.request_id]
                self.stats.requests_finished += 1
                self.stats.e2e_s.append(now - state.arrival)
        return outputs

    def _fork_siblings(self, state: RequestState, parent: Sequence) -> None:
        """n > 1: siblings share the prompt's blocks; each recomputes the last prompt token so
        it draws its own first token (the write into the shared last block copies it first)."""
        for child in state.pending_forks:
            self.block_manager.fork(parent, child)
            child.num_computed_tokens = parent.num_prompt_tokens - 1
            child.num_registered_blocks = min(parent.num_registered_blocks, child.num_computed_tokens // self.config.block_size)
            child.num_cached_tokens = parent.num_cached_tokens
            self.outputs.track(state, child)
            self.scheduler.add_running(child)
        state.pending_forks = []

    def shutdown(self) -> None:
        """Release the backend's worker processes, if it has any (tensor parallelism)."""
        stop = getattr(self.backend, "shutdown", None)
        if stop is not None:
            stop()

    def stats_snapshot(self) -> dict:
        return self.stats.snapshot(self.scheduler, self.block_manager)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; pass one with chat_template=")
        return self.tokenizer.apply_chat_template(
            messages, chat_template=self.chat_template, add_generation_prompt=add_generation_prompt,
            tokenize=False, **kwargs,
        )


class LLM:
    """Offline batch generation: ``LLM(model=...).generate(prompts, params)``."""

    def __init__(self, model: str, backend: str = "auto", dtype: str = "auto", **engine_options: Any):
        self.engine = LLMEngine(EngineConfig(model=model, backend=backend, dtype=dtype, **engine_options))
        self.tokenizer = self.engine.tokenizer

    def generate(
        self, prompts: Prompt | Seq[Prompt], params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            prompts = [prompts]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(prompts)
        if len(params_list) != len(prompts):
            raise ValueError("params must be one SamplingParams or one per prompt")
        ids = []
        try:
            for prompt, p in zip(prompts, params_list):
                rid = uuid.uuid4().hex
                self.engine.add_request(rid, prompt, p)
                ids.append(rid)
        except Exception:
            for rid in ids:
                self.engine.abort_request(rid)
            raise
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[rid] for rid in ids]

    def chat(
        self, messages: list[dict] | list[list[dict]], params: SamplingParams | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        prompts = [
            self.engine.apply_chat_template(c, **(chat_template_kwargs or {})) for c in conversations
        ]
        # The template already holds any BOS/special tokens: do not add them a second time.
        ids = [self.engine.tokenizer.encode(p, add_special_tokens=False) for p in prompts]
        return self.generate(ids, params)
