"""Engine counters read by /metrics and the dashboards (latency histograms live in the server)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class EngineStats:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_finished: int = 0
    requests_failed: int = 0
    steps: int = 0

    def snapshot(self, scheduler: Any, block_manager: Any) -> dict:
        bm = block_manager
        return {
            "num_running": len(scheduler.running),
            "num_waiting": len(scheduler.waiting),
            "kv_usage": bm.usage,
            "num_free_blocks": bm.num_free_blocks,
            "num_blocks": bm.num_blocks,
            "prefix_cache_queries": bm.prefix_queries,
            "prefix_cache_hits": bm.prefix_hits,
            "num_preemptions": scheduler.num_preemptions,
            "prompt_tokens": self.prompt_tokens,
            "generation_tokens": self.generation_tokens,
            "requests_finished": self.requests_finished,
            "requests_failed": self.requests_failed,
            "steps": self.steps,
        }
