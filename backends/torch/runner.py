"""The torch backend: the same contract as MLX. Plain torch on CPU; Triton kernels on CUDA.

With tensor_parallel_size > 1 this process is rank 0: it spawns one worker process per other
rank, broadcasts each step's batch to them, and samples from the all-gathered logits.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lantern.app.engine.contract import BackendOptions, ModelInfo, ModelSpec, ScheduledBatch, StepOutput
from lantern.app.engine.errors import EngineDeadError
from lantern.backends.base import kv_layer_layouts, kv_layout_of
from lantern.backends.paged_plan import plan_attention
from lantern.backends.torch.attention import TorchKVPool, build_metadata
from lantern.backends.torch.cpu_malloc import keep_freed_memory
from lantern.backends.torch.cuda_graphs import MAX_CAPTURE_SIZE, DecodeGraphRunner, take_carried
from lantern.backends.torch.kernels import ops
from lantern.backends.torch.layers import rope_tables
from lantern.backends.torch.models import build_model
from lantern.backends.torch.parallel import TPGroup, broadcast_command, local_config
from lantern.backends.torch.quant_linear import quantized_bytes
from lantern.backends.torch.sampler import DrawnTokens, draw, prompt_logprobs, use_native_cpu_ops
from lantern.backends.torch.weights import load_weights

logger = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


# A forward-pass collective that waits longer than this means a rank is gone (NCCL would
# otherwise wait 10 min). Commands travel on a group of their own without it: a worker may wait
# for the next step as long as the server stays idle.
def _tp_timeout() -> datetime.timedelta:
    return datetime.timedelta(seconds=float(os.environ.get("LANTERN_TP_TIMEOUT_S", "120")))


IDLE_TIMEOUT = datetime.timedelta(days=365)
# Start-up: spawned ranks import torch and load their shard before they join; on a busy machine
# that outlasts a short collective timeout.
START_TIMEOUT = datetime.timedelta(minutes=10)


def _tokens_of(after: DrawnTokens | None) -> torch.Tensor:
    if after is None:
        raise ValueError("a batch with carried token ids needs the step it follows (launch's `after`)")
    return after.tokens


def _rank_device(rank: int) -> torch.device:
    return torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")


class TorchBackend:
    name = "torch"

    def __init__(
        self,
        device: str | None = None,
        options: BackendOptions | None = None,
        static_decode: bool | None = None,
    ) -> None:
        """static_decode: run decode steps through static buffers replayed as CUDA graphs. None
        means on for one CUDA rank with Triton unless enforce_eager; True elsewhere runs the same
        padded path without capture (how tests check it on a CPU)."""
        options = options or BackendOptions()
        self.options = options
        self.world = options.tensor_parallel_size
        self.device = torch.device(device) if device else _rank_device(0)
        if self.device.type == "cuda" and self.device.index is None:  # "cuda": the current GPU, named
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)  # every rank its own GPU, also for NCCL
        if options.num_threads is not None:
            torch.set_num_threads(options.num_threads)
        self.kv_memory_is_lazy = self.device.type == "cpu"
        self.default_step_tokens = 512 if self.device.type == "cpu" else 2048  # base.Backend says why
        logger.info("torch %s on %s, %d CPU threads", torch.__version__, self.device, torch.get_num_threads())
        self.tp = TPGroup(0, self.world)
        self.pool: TorchKVPool | None = None
        self.block_size = 0
        self.workers: list = []
        self.commands: Any = None  # the process group commands travel on (tensor parallelism)
        self._in_step = False
        can_capture = (
            self.device.type == "cuda" and self.world == 1 and ops.use_triton(torch.empty(0, device=self.device))
        )
        self.capture_graphs = can_capture and not options.enforce_eager
        if options.compile_decode and (self.device.type != "cpu" or self.world > 1):
            raise ValueError(
                "--compile applies to the torch backend on a CPU, one rank (on CUDA, decode steps run as CUDA graphs)"
            )
        self.static_decode = self.capture_graphs if static_decode is None else static_decode
        self.graphs: DecodeGraphRunner | None = None
        # base.LaunchingBackend: CUDA runs a launched step while the host goes on; a CPU runs it in the call.
        self.steps_run_async = self.device.type == "cuda"
        self.carries_tokens = self.world == 1  # (workers in other processes get the batch's ids from the host)

    # ---- set-up --------------------------------------------------------------------------
    def load(self, spec: ModelSpec) -> ModelInfo:
        if spec.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}; got {spec.dtype!r}")
        local_config(spec.config, self.world)  # fail early on an indivisible model
        if self.world > 1:
            self._start_workers(spec)
        return self._load_local(spec)

    def _load_local(self, spec: ModelSpec) -> ModelInfo:
        self.dtype = DTYPES[spec.dtype]
        self.cfg = spec.config
        self.local_cfg = local_config(spec.config, self.world)
        with torch.device("meta"):
            model = build_model(spec.config, self.tp)
        # Counted on the meta model, before packed quantized layers hide the logical shapes.
        num_params = sum(p.numel() for p in model.parameters()) * self.world
        # Each tensor is placed on the device as it is read (quantized ones stay quantized): no
        # float staging copy of the whole model in host memory.
        load_weights(model, spec, self.tp, self.device, self.dtype)
        model.eval()
        self.model = model
        self.kv_layout = kv_layout_of(model, self.local_cfg)  # what the pool holds per token and layer
        # The positions served: Llama 4's rope reaches 10M, its chunked attention is served within 8192.
        self.max_context = spec.config.servable_context
        self.cos, self.sin = rope_tables(spec.config, self.max_context, self.device)
        if self.device.type == "cpu":
            use_native_cpu_ops()  # one-pass sampling: its op library is built now, not in a request
        weight_bytes = quantized_bytes(model)  # every parameter and buffer, quantized or not
        logger.info("weights: %.1f MB on %s", weight_bytes / 1e6, self.device)
        return ModelInfo(
            num_params=num_params,
            weight_bytes=weight_bytes,
            max_model_len=self.max_context,
            vocab_size=spec.config.vocab_size,
        )

    def _start_workers(self, spec: ModelSpec) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        ctx = mp.get_context("spawn")
        self.workers = [
            ctx.Process(target=_worker_main, args=(r, self.world, port, spec, self.options), daemon=True)
            for r in range(1, self.world)
        ]
        for w in self.workers:
            w.start()
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=self.world, timeout=START_TIMEOUT
        )
        self.commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
        self.tp = dataclasses.replace(self.tp, group=dist.new_group(backend=backend, timeout=_tp_timeout()))
        logger.info("tensor parallel: %d ranks over %s", self.world, backend)

    def shutdown(self) -> None:
        if not self.workers:
            return
        if self._in_step:  # called from another thread while a step is stuck in a collective
            for w in self.workers:
                w.kill()
            self.workers = []
            return
        if all(w.is_alive() for w in self.workers):
            broadcast_command(self.tp, ("stop", None), self.commands)
        for w in self.workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
        dist.destroy_process_group()
        self.workers = []

    def _check_workers(self) -> None:
        """A dead rank would leave every collective waiting: report it instead."""
        for rank, w in enumerate(self.workers, start=1):
            if not w.is_alive():
                raise EngineDeadError(f"tensor-parallel worker rank {rank} died (exit code {w.exitcode})")

    def kv_bytes_per_block(self, block_size: int) -> int:
        per_token = sum(layout.elements_per_token() for layout in kv_layer_layouts(self.kv_layout, self.local_cfg))
        return block_size * per_token * self.dtype.itemsize

    def state_bytes_per_seq(self) -> int:
        return self.model.state_bytes_per_seq(self.dtype) if self.cfg.recurrent else 0

    def available_memory_bytes(self) -> int:
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free)
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE") // self.world

    def allocate_kv(self, num_blocks: int, block_size: int, max_num_seqs: int, state_slots: int) -> None:
        if self.workers:  # (tensor parallelism refuses models with recurrent state: no state slots there)
            broadcast_command(self.tp, ("allocate", (num_blocks, block_size, max_num_seqs, state_slots)), self.commands)
        self._allocate_local(num_blocks, block_size, max_num_seqs, state_slots)

    def copy_state_slots(self, pairs: list[tuple[int, int]]) -> None:
        src = torch.tensor([p[0] for p in pairs], device=self.device)
        dst = torch.tensor([p[1] for p in pairs], device=self.device)
        for t in self.model.state_tensors():
            t[dst] = t[src]

    def _allocate_local(self, num_blocks: int, block_size: int, max_num_seqs: int, state_slots: int) -> None:
        kvh, k_dim, v_dim, v_in_k = self.kv_layout
        self.block_size = block_size
        self.pool = TorchKVPool(
            self.local_cfg.num_kv_layers,
            num_blocks * block_size,
            kvh,
            k_dim,
            self.dtype,
            self.device,
            v_dim=v_dim,
            v_is_k_prefix=v_in_k,
            layer_shapes=None if self.local_cfg.kv_shapes is None else list(self.local_cfg.kv_shapes),
        )
        if self.cfg.recurrent:  # a recurrent-state slot per sequence a step may hold, then the snapshots
            self.model.allocate_state(state_slots, self.dtype, self.device)
            if self.static_decode or self.options.compile_decode:
                logger.info("decode steps run eagerly: this model's recurrent layers update a per-sequence state")
            self.static_decode = self.capture_graphs = False
        if self.device.type == "cpu":
            keep_freed_memory()  # now, after the weights and the KV pool (cpu_malloc says why)
        if self.options.compile_decode and self.cfg.alibi_slopes is not None:  # (its reference attention path)
            logger.info("decode steps run eagerly: this model's ALiBi attention takes the reference attention path")
        elif self.options.compile_decode and not self.cfg.recurrent:
            self._compile_decode(block_size)
        # The reference attention path (MLA's KV layout, ALiBi's biases) syncs with the host: no capture
        if (v_in_k or self.cfg.alibi_slopes is not None) and self.static_decode:
            why = "KV layout" if v_in_k else "ALiBi attention"
            logger.info("decode steps run eagerly: this model's %s takes the reference attention path", why)
            self.static_decode = self.capture_graphs = False
        eager = getattr(self.model, "eager_decode", None)  # a model file whose decode syncs with the host says why
        if eager and self.static_decode:
            logger.info("decode steps run eagerly: %s", eager)
            self.static_decode = self.capture_graphs = False
        if self.static_decode:
            max_blocks = min(num_blocks, -(-self.max_context // block_size))
            self.graphs = DecodeGraphRunner(
                self.model,
                self.pool,
                self.cos,
                self.sin,
                block_size,
                max_blocks,
                max_batch=min(max_num_seqs, MAX_CAPTURE_SIZE),
                capture=self.capture_graphs,
            )
            logger.info(
                "decode steps %s (batch buckets up to %d)",
                "as CUDA graphs" if self.capture_graphs else "through static buffers",
                self.graphs.buckets[-1],
            )
            if self.capture_graphs and not self.graphs.capture_all():
                self.graphs, self.static_decode, self.capture_graphs = None, False, False

    def _compile_decode(self, block_size: int) -> None:
        from lantern.backends.torch import compiled_decode
        from lantern.backends.torch.models.llama import CausalLM

        model = self.model
        shared = isinstance(model, CausalLM) and type(model).hidden_states is CausalLM.hidden_states
        windows = compiled_decode.layer_windows(model.model.layers) if shared else None
        if windows is None or self.kv_layout[3]:
            logger.warning("--compile: not for this architecture (%s); decode steps run eagerly", type(model).__name__)
            return
        model.compiled_decode = compiled_decode.CompiledDecode(model.model.layers, windows)
        compiled_decode.warm_up(model, self.pool, self.cos, self.sin, block_size)

    # ---- steps ---------------------------------------------------------------------------
    @torch.inference_mode()
    def compute_logits(self, batch: ScheduledBatch, after: DrawnTokens | None = None) -> torch.Tensor:
        """after: the launched step whose tokens the batch's carried rows take (launch())."""
        if not self.workers:
            return self._forward(batch, after)
        self._check_workers()
        self._in_step = True
        try:
            # Workers only run the forward pass: they get no sampling rows (the biggest part).
            broadcast_command(self.tp, ("step", dataclasses.replace(batch, sampling=[])), self.commands)
            return self._forward(batch)
        except Exception as exc:
            # The ranks are out of step now (some wait in a collective the others left): no
            # retry can pair them up again, so this is the end of this backend, said plainly.
            self._check_workers()
            raise EngineDeadError(f"tensor-parallel step failed, ranks out of step: {exc}") from exc
        finally:
            self._in_step = False

    def _forward(self, batch: ScheduledBatch, after: DrawnTokens | None = None) -> torch.Tensor:
        carried = None if batch.carried is None else (batch.carried, _tokens_of(after))
        if self.graphs is not None and self.graphs.supports(batch):
            return self.graphs.run(batch, carried)
        plan = plan_attention(batch)
        meta = build_metadata(self.pool, batch, plan, self.cos, self.sin)
        ids = torch.from_numpy(batch.input_ids).to(self.device, torch.long)
        if carried is not None:
            take_carried(ids, torch.from_numpy(carried[0]).to(self.device, torch.long), carried[1])
        logits_idx = torch.from_numpy(plan.logits_idx).to(self.device, torch.long)
        return self.model(ids, meta, logits_idx).float()

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> StepOutput:
        return self.launch(batch).result()

    @torch.inference_mode()
    def launch(self, batch: ScheduledBatch, after: DrawnTokens | None = None) -> DrawnTokens:
        """The step queued on the device (base.LaunchingBackend): nothing is read back until result(), except
        where a step's own work needs a value on the host (prompt logprobs, top-k/top-p filtering's width)."""
        logits = self.compute_logits(batch, after)
        n = len(batch.sampling)  # (the rows past them score prompt tokens: prompt_logprobs)
        scored = prompt_logprobs(logits[n:], batch.prompt_rows) if batch.prompt_rows else None
        if n:
            drawn = draw(logits[:n], batch.sampling)
        else:
            drawn = DrawnTokens(torch.empty(0, dtype=torch.long, device=logits.device), [])
        drawn.scored = scored
        return drawn

    def embed(self, batch: ScheduledBatch, rows: list) -> list:
        """Pooled final hidden states instead of samples (backends/base.EmbeddingBackend)."""
        from lantern.backends.torch.embed import embed_step  # only embedding servers pay its import

        return embed_step(self, batch, rows)


def _worker_main(rank: int, world: int, port: int, spec: ModelSpec, options: BackendOptions) -> None:
    """Ranks 1..N-1: hold a shard, mirror rank 0's forward pass step by step."""
    device = _rank_device(rank)
    backend_name = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)  # before NCCL: each rank talks from its own GPU
    dist.init_process_group(
        backend_name, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=START_TIMEOUT
    )
    commands = dist.new_group(backend="gloo", timeout=IDLE_TIMEOUT)
    forward = dist.new_group(backend=backend_name, timeout=_tp_timeout())  # same order as rank 0
    backend = TorchBackend(device=str(device), options=options)
    backend.tp = TPGroup(rank, world, forward)
    backend._load_local(spec)
    with torch.inference_mode():
        while True:
            kind, payload = broadcast_command(backend.tp, None, commands)
            if kind == "stop":
                break
            if kind == "allocate":
                backend._allocate_local(*payload)
            elif kind == "step":
                backend._forward(payload)
    dist.destroy_process_group()
