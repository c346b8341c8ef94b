"""The synchronous engine (`LLMEngine.step`) and the offline `LLM` API on top of it."""

from __future__ import annotations

import dataclasses
import logging
import random
import time
import uuid
from collections.abc import Sequence as Seq
from typing import Any

from lantern.app.config import EngineConfig
from lantern.app.engine.batch import build_batch
from lantern.app.engine.block_manager import BlockManager
from lantern.app.engine.chat_encoding import encode_chat
from lantern.app.engine.contract import FinishedStep, PendingStep, ScheduledBatch, StepOutput
from lantern.app.engine.embedding import (
    ENCODER_STEP_TOKENS,
    EmbeddingOutput,
    embed_offline,
    embedding_task,
    make_embedder,
    wrong_task,
)
from lantern.app.engine.errors import EngineDeadError, InvalidRequestError
from lantern.app.engine.kv_sizing import plan_kv_cache
from lantern.app.engine.metrics import EngineStats
from lantern.app.engine.output_processor import OutputProcessor, RequestState
from lantern.app.engine.reasoning import THINK, detect
from lantern.app.engine.reasoning_budget import ThinkingBudgets
from lantern.app.engine.request import RequestOutput
from lantern.app.engine.sampling_params import SamplingParams, StructuredSpec
from lantern.app.engine.scheduler import ScheduledSeq, Scheduler, SchedulerConfig, SchedulerOutput
from lantern.app.engine.sequence import Sequence, TokenLogprob
from lantern.app.engine.step_ahead import Launched, StepAhead
from lantern.app.engine.structured import GrammarCompiler

logger = logging.getLogger(__name__)

Prompt = str | list[int]
# Steps in a row whose every sequence failed on its own before the backend is declared broken.
MAX_CONSECUTIVE_FAILED_STEPS = 3


class LLMEngine:
    def __init__(self, config: EngineConfig, backend: Any = None):
        from lantern.app.models.loader import (
            resolve_model,  # here: the loader imports the contract, and so this package
        )
        from lantern.backends import (  # the only place the core meets a backend
            create_backend,
            default_dtype,
            pick_backend,
        )
        from lantern.backends.base import Backend, LaunchingBackend

        self.config = config
        backend_name = pick_backend(config.backend) if backend is None else backend.name
        dtype = config.dtype if config.dtype != "auto" else default_dtype(backend_name)
        t0 = time.monotonic()
        loaded = resolve_model(config.model, dtype)
        loaded.spec.isq = config.quantization
        # Generation or embeddings (app/engine/embedding.py: an embedding decoder loads no head).
        self.task, pooling = embedding_task(config, loaded.spec)
        self.model_name = loaded.spec.name
        self.model_config = loaded.spec.config
        self.tokenizer = loaded.tokenizer
        self.chat_template = config.chat_template or loaded.chat_template
        self.eos_token_ids = loaded.eos_token_ids
        self.backend = backend or create_backend(backend_name, config.backend_options)
        if not isinstance(self.backend, Backend):
            raise TypeError(f"{type(self.backend).__name__} does not implement backends.base.Backend")
        loaded.spec.config.serve_context(config.max_model_len)  # rope choices that hang on the context
        info = self.backend.load(loaded.spec)
        logger.info(
            "loaded %s on %s (%s): %.1fM parameters, %.1f MiB of weights in %.1fs",
            self.model_name,
            self.backend.name,
            dtype,
            info.num_params / 1e6,
            info.weight_bytes / 2**20,
            time.monotonic() - t0,
        )
        budget = config.max_num_batched_tokens
        if budget is None:
            # Every running sequence's decode token always fits a step: a smaller budget would leave
            # the newest ones waiting behind the oldest (vLLM refuses such a budget).
            budget = max(self.backend.default_step_tokens, config.max_num_seqs)
            if pooling is not None and self.model_config.encoder is not None:
                budget = max(budget, ENCODER_STEP_TOKENS)  # no decode to keep fast: batch as sentence-transformers
            self.config = config = dataclasses.replace(config, max_num_batched_tokens=budget)
            logger.info("%d tokens per step at most (--max-num-batched-tokens)", budget)
        self.vocab_size = info.vocab_size
        self.num_params, self.weight_bytes = info.num_params, info.weight_bytes
        recurrent = self.model_config.recurrent
        # When no layer reads past its window, blocks behind it go back to the pool as a sequence grows.
        release_window = self.model_config.sliding_window if self.model_config.all_layers_slide else None
        plan_config = config
        if recurrent and (pooling is not None or release_window is not None):
            # No state snapshots: embedding inputs are never cached, and a snapshot's boundary would need
            # the blocks its window reads (released ones too) checked again (no such hybrid exists yet).
            plan_config = dataclasses.replace(config, prefix_cache_states=0)
        plan = plan_kv_cache(plan_config, self.model_config, info.max_model_len, self.backend)
        if plan.max_num_seqs != config.max_num_seqs:  # lowered: the recurrent state would not fit
            self.config = config = dataclasses.replace(config, max_num_seqs=plan.max_num_seqs)
        if recurrent and config.enable_prefix_caching:
            # A cached prefix restores the attention layers' K/V from the pool and the recurrent layers'
            # state from a snapshot taken at a block boundary (app/engine/state_cache.py); without room
            # for one, only a computation from position 0 rebuilds the state.
            if plan.state_snapshots:
                kept = plan.state_snapshots
                logger.info("prefix caching: the recurrent state is kept at block boundaries in %d snapshots", kept)
            else:
                logger.info("prefix caching is off: no snapshot of this model's recurrent state can be kept")
                self.config = config = dataclasses.replace(config, enable_prefix_caching=False)
        self.max_model_len = plan.max_model_len
        snapshots = plan.state_snapshots  # 0 without recurrent state, a prefix cache or room for one
        state_slots = config.max_num_seqs + snapshots if recurrent else 0
        self.backend.allocate_kv(plan.num_blocks, config.block_size, config.max_num_seqs, state_slots)
        self.block_manager = BlockManager(
            plan.num_blocks,
            config.block_size,
            config.enable_prefix_caching,
            prefer_touched=self.backend.kv_memory_is_lazy,
            cache_budget_blocks=plan.cache_budget_blocks,
            release_window=release_window,
        )
        self.scheduler = Scheduler(
            SchedulerConfig(
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=budget,
                prefill_chunk_size=config.prefill_chunk_size,
                state_slots=config.max_num_seqs if recurrent else 0,
                state_snapshots=snapshots,
            ),
            self.block_manager,
        )
        self.outputs = OutputProcessor(self.tokenizer, self.eos_token_ids, self.max_model_len)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.eos_token_ids)
        # thinking_token_budget, counted in the reasoning markup the chat template shows (<think> when none)
        self.budgets = ThinkingBudgets(self.tokenizer, self.grammars.vocab, detect(self.chat_template) or THINK)
        self.requests: dict[str, RequestState] = {}
        self.stats = EngineStats()
        self._consecutive_failures = 0
        self.embedder = None if pooling is None else make_embedder(self, loaded.spec, self.task, pooling)
        self._launcher: Any = self.backend if isinstance(self.backend, LaunchingBackend) else None
        self.ahead = self._step_ahead(config.async_scheduling)
        self._ahead: Launched | None = None  # the step self.ahead launched, collected by the next step()

    def _step_ahead(self, wanted: bool | None) -> StepAhead | None:
        """Decode steps scheduled ahead where the backend can take carried token ids and runs them asynchronously
        (or where the config asks for it), for models without recurrent state, outside embedding servers."""
        backend = self._launcher
        able = backend is not None and backend.carries_tokens and not self.model_config.recurrent and not self.embedder
        if wanted and not able:
            logger.warning("async scheduling: not for this model or backend; steps run one after the other")
        if not able or wanted is False or (wanted is None and not backend.steps_run_async):
            return None
        logger.info("async scheduling: each decode step is launched before the last one's tokens are processed")
        return StepAhead(self.scheduler, backend, self.config.block_size, self._continues)

    # ---- requests ------------------------------------------------------------------------
    def tokenize_prompt(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, str):
            return self.tokenizer.encode(prompt, add_special_tokens=True)
        return list(prompt)

    def encode_chat(
        self, messages: list[dict], add_generation_prompt: bool = True, chat_template_kwargs: dict | None = None
    ) -> list[int]:
        """Messages -> prompt ids through the chat template; markup typed inside a message stays text."""
        if self.embedder is not None:  # a conversation is for generation: say so before any template runs
            raise wrong_task(self.task, self.model_name, "generate")
        return encode_chat(
            self.tokenizer, self.chat_template, messages, add_generation_prompt, **(chat_template_kwargs or {})
        )

    def validate(self, prompt_ids: list[int], params: SamplingParams) -> None:
        if self.embedder is not None:
            raise wrong_task(self.task, self.model_name, "generate")
        if not prompt_ids:
            raise InvalidRequestError("prompt must not be empty", param="prompt")
        vocab = self.vocab_size
        if any(type(t) is not int or not 0 <= t < vocab for t in prompt_ids):
            raise InvalidRequestError(f"prompt token ids must be integers in [0, {vocab})", param="prompt")
        if len(prompt_ids) >= self.max_model_len:
            raise InvalidRequestError(
                f"prompt is {len(prompt_ids)} tokens; this model's context is {self.max_model_len} "
                "tokens and at least one must be left for the reply",
                param="prompt",
                code="context_length_exceeded",
            )
        if any(t >= vocab for t in params.stop_token_ids or ()):
            raise InvalidRequestError(f"stop_token_ids must be ids in [0, {vocab})", param="stop_token_ids")
        if params.logit_bias and any(t >= vocab for t in params.logit_bias):
            raise InvalidRequestError(f"logit_bias keys must be token ids in [0, {vocab})", param="logit_bias")
        if params.allowed_token_ids and any(t >= vocab for t in params.allowed_token_ids):
            raise InvalidRequestError(f"allowed_token_ids must be ids in [0, {vocab})", param="allowed_token_ids")
        if params.structured is not None:
            self.compile_grammar(params.structured)  # a cache hit when the front end compiled it already

    def compile_grammar(self, spec: StructuredSpec) -> None:
        """Compile (and cache) a structured-output spec; InvalidRequestError naming its field when
        it is invalid. Thread-safe: front ends call it off the engine thread, before queueing."""
        self.grammars.compile(spec)

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None = None,
        prompt_token_ids: list[int] | None = None,
        cache_salt: str | None = None,
        validated: bool = False,
    ) -> None:
        """validated: the caller has run validate(ids, params) on exactly these ids (AsyncEngine
        does, before queueing), so the engine thread does not walk a long prompt again."""
        params = params or SamplingParams()
        ids = prompt_token_ids if prompt_token_ids is not None else self.tokenize_prompt(prompt)
        if not validated:
            self.validate(ids, params)
        if request_id in self.requests:
            raise InvalidRequestError(f"request_id {request_id!r} is already in use", param="request_id")
        room = self.max_model_len - len(ids)
        max_tokens = min(params.max_tokens or room, room)
        base_seed = params.seed if params.seed is not None else random.getrandbits(48)
        salt = (cache_salt or "").encode("utf-8", "surrogatepass")
        state = RequestState(request_id, prompt if isinstance(prompt, str) else None, ids, params, max_tokens)
        # n > 1 is a fan-out of n sequences with seeds seed+i: sample i equals the single
        # request with seed+i. The others wait until the first has computed the prompt, then
        # read it from the prefix cache instead of computing it again.
        seqs = [
            Sequence(request_id, ids, params, index=i, seed=base_seed + i, cache_salt=salt) for i in range(params.n)
        ]
        scored = params.prompt_logprobs is not None
        if scored:  # the first sample computes every prompt position (Sequence.scores_prompt)
            seqs[0].prompt_logprobs = [None] * len(ids)
        for seq in seqs:
            self.outputs.track(state, seq, self.grammars.constraint(params))
        self.budgets.track(seqs)
        if self.config.enable_prefix_caching or scored:  # (scored: its prompt's logprobs are whole before any sample)
            state.pending_children = seqs[1:]
            seqs = seqs[:1]
        self.requests[request_id] = state
        for seq in seqs:
            self.scheduler.add(seq)

    def abort_request(
        self, request_id: str, reason: str = "abort", error: str | None = None, error_param: str | None = None
    ) -> RequestOutput | None:
        """Stop a request wherever it is and free its blocks; returns its final output."""
        if self.embedder is not None:
            return self.embedder.abort(request_id, error)  # type: ignore[return-value]  # an EmbeddingOutput
        state = self.requests.pop(request_id, None)
        if state is None:
            return None
        state.pending_children.clear()
        for out in state.seqs:
            self.scheduler.finish(out.seq, reason)
        if error is not None:
            self.stats.requests_failed += 1
        final = self.outputs.make_output(state)
        final.error, final.error_param = error, error_param if error is not None else None
        return final

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests) or (self.embedder is not None and self.embedder.has_work)

    # ---- the step ------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """One scheduled batch through the backend. A failure fails only the requests that
        cause it: the batch is retried one sequence at a time to find them. A backend that
        fails every sequence of several multi-sequence steps in a row is broken, not fed bad
        requests: that is reported as the engine's death, not as one failed request after another.
        With steps scheduled ahead (app/engine/step_ahead.py) the batch may have been launched by the
        call before, and the next one is launched before this one's tokens are read."""
        launched = self._take_ahead()
        if launched is None:
            sched = self.scheduler.schedule()
            if not sched.scheduled:
                return []
            if sched.state_restores:  # sequences starting from a cached prefix take its recurrent state
                self.backend.copy_state_slots(sched.state_restores)
            try:
                launched = (sched, *self._launch(sched))
            except EngineDeadError:
                raise  # the backend itself is gone: no request can be run, so none is to blame
            except Exception as exc:
                return self._isolate(sched, exc)
        sched, batch, pending = launched
        if self.ahead is not None:
            self._ahead = self.ahead.launch_after(sched, batch, pending)
        try:
            result = pending.result()
        except Exception as exc:
            self._drop_ahead()  # (it took this step's tokens)
            if isinstance(exc, EngineDeadError):
                raise
            return self._isolate(sched, exc)
        self._consecutive_failures = 0
        return self._process(sched, batch, result)

    def _take_ahead(self) -> Launched | None:
        """The step launched ahead by the last call, unless every sequence it continued has ended since (then
        it is waited for and dropped)."""
        if self._ahead is None or any(not item.seq.is_finished for item in self._ahead[0].scheduled):
            launched, self._ahead = self._ahead, None
            return launched
        self._drop_ahead()
        return None

    def _drop_ahead(self) -> None:
        """Wait for the step launched ahead and drop it: the steps reach the host in launch order, so the backend
        may reuse what step N-1 held once step N+1 is launched (the CUDA-graph runner's host staging)."""
        launched, self._ahead = self._ahead, None
        if launched is not None:
            try:
                launched[2].result()
            except Exception as exc:  # (its tokens are nobody's now; a broken backend fails the next step)
                logger.debug("a dropped step scheduled ahead failed: %s", exc)

    def _continues(self, seq: Sequence) -> bool | None:
        """Whether seq may decode its next token before the host has its last one; None: that token ends it
        (StepAhead's `continues`)."""
        state = self.requests.get(seq.request_id)
        n_out = len(seq.output_token_ids) + 1  # (with the token in flight)
        if state is None or n_out >= state.max_tokens or seq.num_tokens + 1 >= self.max_model_len:
            return None
        p = seq.params
        needs_token = p.uses_penalties or seq.seq_id in self.budgets.states or n_out < p.min_tokens
        return not needs_token and self.outputs.constraint(self.requests, seq) is None

    def _isolate(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        items = sched.scheduled
        if len(items) > 1:
            logger.warning("a step of %d sequences failed (%s); retrying them one by one", len(items), exc)
        outputs: list[RequestOutput] = []
        failures = 0
        for item in items:
            if item.seq.is_finished:  # a sibling of a request failed just now
                continue
            if len(items) > 1:
                try:
                    outputs += self._run_alone(item)
                except EngineDeadError:
                    raise
                except Exception as err:
                    exc = err
                else:
                    continue
            failures += 1
            outputs.append(self._fail(item.seq.request_id, exc))
        # One request failing alone proves nothing about the backend; several failing each on
        # their own, step after step, do.
        if failures < len(items):
            self._consecutive_failures = 0
        elif len(items) > 1:
            self._consecutive_failures += 1
        if self._consecutive_failures >= MAX_CONSECUTIVE_FAILED_STEPS:
            raise EngineDeadError(f"the backend failed every request of {self._consecutive_failures} steps: {exc}")
        return outputs

    def _run_alone(self, item: ScheduledSeq) -> list[RequestOutput]:
        """A failed step's sequence on its own. A recurrent state may have been advanced by the failed
        forward pass part way (layer by layer), so such a sequence is recomputed from position 0, chunk
        by chunk, instead (its KV blocks are rewritten with the same values), or from the furthest snapshot
        of it the prefix cache still holds: its own decode snapshot, else the one it started from."""
        if not self.model_config.recurrent:
            one = SchedulerOutput(scheduled=[item])
            return self._process(one, *self._execute(one))
        seq, outputs = item.seq, []
        end = seq.num_computed_tokens + item.num_new_tokens
        seq.num_computed_tokens = 0
        states = self.scheduler.states
        for snap in (seq.decode_snapshot, seq.state_restore):
            if snap is not None and states is not None and seq.state_slot is not None and states.holds(snap):
                self.backend.copy_state_slots([(snap.slot, seq.state_slot)])
                seq.num_computed_tokens = snap.tokens
                break
        while seq.num_computed_tokens < end and not seq.is_finished:
            n = self.scheduler.chunk_tokens(seq, end - seq.num_computed_tokens)  # cut at snapshot points too
            one = SchedulerOutput(scheduled=[ScheduledSeq(seq, n)])
            outputs += self._process(one, *self._execute(one))
        return outputs

    def _fail(self, request_id: str, exc: Exception) -> RequestOutput:
        if isinstance(exc, InvalidRequestError) and exc.param:  # the request's own fault: a 400
            logger.info("request %s stopped: %s", request_id, exc.message)
            out = self.abort_request(request_id, "error", error=exc.message, error_param=exc.param)
            assert out is not None
            return out
        logger.error("request %s failed in the engine: %s", request_id, exc, exc_info=exc)
        message = f"the engine failed while running this request ({type(exc).__name__}: {exc})"
        out = self.abort_request(request_id, "error", error=message)
        assert out is not None
        return out

    def _execute(self, sched: SchedulerOutput) -> tuple[ScheduledBatch, StepOutput]:
        """The part of a step that changes no engine state, so a failure can simply be retried."""
        batch, pending = self._launch(sched)
        return batch, pending.result()

    def _launch(self, sched: SchedulerOutput) -> tuple[ScheduledBatch, PendingStep]:
        if self.embedder is not None:
            batch, result = self.embedder.execute(sched)
            return batch, FinishedStep(result)
        banned = {s.seq.seq_id: self.outputs.banned_tokens(s.seq) for s in sched.scheduled if s.samples}
        batch = build_batch(sched, self.config.block_size, banned)
        seqs = [sched.scheduled[i].seq for i in batch.sample_seq_indices]
        self.grammars.attach_masks(batch.sampling, [self.outputs.constraint(self.requests, s) for s in seqs])
        self.budgets.force(batch.sampling, seqs)  # after the grammar masks: it narrows them
        if self._launcher is not None:
            return batch, self._launcher.launch(batch)
        return batch, FinishedStep(self.backend.execute(batch))

    def _process(self, sched: SchedulerOutput, batch: ScheduledBatch, result: StepOutput) -> list[RequestOutput]:
        """Advance the sequences and hand out the new tokens; a failure here fails only its request."""
        if self.embedder is not None:
            return self.embedder.process(sched, batch, result)  # type: ignore[return-value]  # EmbeddingOutputs
        saves = self.scheduler.after_step(sched)
        if saves:  # recurrent states at a snapshot point, before the next step moves them on
            self.backend.copy_state_slots(saves)
        self.stats.steps += 1
        touched: dict[str, RequestState] = {}
        failed: list[RequestOutput] = []
        for entry, scored in zip(batch.prompt_rows, result.prompt_logprobs or [], strict=True):
            seq = sched.scheduled[entry.seq_index].seq
            for j, (target, (logprob, rank, top)) in enumerate(zip(entry.targets, scored, strict=True)):
                seq.prompt_logprobs[entry.position + j + 1] = TokenLogprob(target, logprob, dict(top), rank)
        for row, seq_idx in enumerate(batch.sample_seq_indices):
            seq = sched.scheduled[seq_idx].seq
            state = self.requests.get(seq.request_id)
            if state is None or seq.is_finished:
                continue
            try:
                self._append(state, seq, row, result)
            except Exception as exc:
                touched.pop(state.request_id, None)
                failed.append(self._fail(state.request_id, exc))
                continue
            touched[state.request_id] = state
        outputs = failed
        for state in touched.values():
            outputs.append(self.outputs.make_output(state))
            if state.finished:
                del self.requests[state.request_id]
                self.stats.requests_finished += 1
        return outputs

    def _append(self, state: RequestState, seq: Sequence, row: int, result: Any) -> None:
        if not seq.output_token_ids:
            if seq.index == 0:
                self.stats.prompt_tokens += seq.num_prompt_tokens
            if state.pending_children:  # the prompt is in the cache now: the other samples start
                self.scheduler.add_front(state.pending_children)
                state.pending_children = []
        token = result.token_ids[row]
        if result.logprobs is not None and seq.params.logprobs is not None:
            top = dict(result.top_logprobs[row]) if result.top_logprobs else {}
            seq.output_logprobs.append(TokenLogprob(token, result.logprobs[row], top))
        out = next(o for o in state.seqs if o.seq is seq)
        reason = self.outputs.append(state, out, token)
        self.stats.generation_tokens += 1
        if state.first_token_time is None:
            state.first_token_time = time.monotonic()
        if reason is not None:
            self.scheduler.finish(seq, reason)

    def shutdown(self) -> None:
        """Release the backend's worker processes, if it has any (tensor parallelism)."""
        self.backend.shutdown()

    def stats_snapshot(self) -> dict:
        return self.stats.snapshot(self.scheduler, self.block_manager)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        if not self.chat_template:
            raise InvalidRequestError("this model has no chat template; pass one with chat_template=", param="messages")
        return self.tokenizer.apply_chat_template(
            messages,
            chat_template=self.chat_template,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **kwargs,
        )


class LLM:
    """Offline batch generation: ``LLM(model=...).generate(prompts, params)``."""

    def __init__(self, model: str, backend: str = "auto", dtype: str = "auto", **engine_options: Any):
        self.engine = LLMEngine(EngineConfig.from_options(model=model, backend=backend, dtype=dtype, **engine_options))
        self.tokenizer = self.engine.tokenizer

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs the prompts to the end. Raises RequestFailedError if the engine failed one (the
        others are finished first); an interrupted call (Ctrl+C) leaves nothing behind."""
        batch: list[Prompt]
        if isinstance(prompts, str) or (prompts and isinstance(prompts[0], int)):
            batch = [prompts]  # type: ignore[list-item]  # one prompt: text or token ids
        else:
            batch = list(prompts)  # type: ignore[arg-type]
        params_list = params if isinstance(params, list) else [params or SamplingParams()] * len(batch)
        if len(params_list) != len(batch):
            raise ValueError("params must be one SamplingParams or one per prompt")
        ids: list[str] = []
        final: dict[str, RequestOutput] = {}
        try:
            for prompt, p in zip(batch, params_list):
                rid = uuid.uuid4().hex
                self.engine.add_request(rid, prompt, p)
                ids.append(rid)
            while len(final) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        final[out.request_id] = out
        finally:
            for rid in ids:
                if rid not in final:
                    self.engine.abort_request(rid)
        for rid in ids:
            final[rid].raise_error()
        return [final[rid] for rid in ids]

    def chat(
        self,
        messages: list[dict] | list[list[dict]],
        params: SamplingParams | None = None,
        chat_template_kwargs: dict | None = None,
    ) -> list[RequestOutput]:
        conversations = messages if messages and isinstance(messages[0], list) else [messages]
        ids = [self.engine.encode_chat(c, chat_template_kwargs=chat_template_kwargs) for c in conversations]  # type: ignore[arg-type]
        return self.generate(ids, params)

    def score(
        self, text_1: str | Seq[str], text_2: str | Seq[str], instruction: str | None = None
    ) -> list[EmbeddingOutput]:
        """Relevance scores (each output's `.score`) of text pairs from a cross-encoder or reranker served with
        task="score": one text_1 with each text_2, or two lists of one length pair by pair (vLLM's LLM.score).
        instruction: a prompt reranker's (Qwen3-Reranker's) task, in place of its default."""
        from lantern.app.engine.scoring import score_offline

        return score_offline(self.engine, text_1, text_2, instruction)

    def classify(self, inputs: Prompt | Seq[Prompt]) -> list[EmbeddingOutput]:
        """Class probabilities (each output's `.probs`, in the order of `LLM.labels`) of the inputs (texts or token
        ids) from a sequence classifier served with task="classify"."""
        one = isinstance(inputs, str) or bool(inputs and isinstance(inputs[0], int))
        return embed_offline(self.engine, [inputs] if one else list(inputs), "classify")  # type: ignore[list-item, arg-type]

    @property
    def labels(self) -> list[str]:
        """A classifier's labels in id order (task classify; empty otherwise)."""
        return list(self.engine.embedder.labels) if self.engine.embedder is not None else []

    def embed(self, inputs: Prompt | Seq[Prompt]) -> list[EmbeddingOutput]:
        """L2-normalized vectors of the inputs (texts or token ids) from a model served with task="embed"."""
        one = isinstance(inputs, str) or bool(inputs and isinstance(inputs[0], int))
        return embed_offline(self.engine, [inputs] if one else list(inputs))  # type: ignore[list-item, arg-type]
