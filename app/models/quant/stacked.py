"""A stacked quantized tensor ([E, out, in]: MLX-format experts, per-head halves) as a sequence of E weights,
each read when it is taken: unpacked all at once, a DeepSeek-V3 expert projection (256 x 2048 x 7168 at
4 bits) would hold ~4 GB of one-byte codes before the first expert was handed on."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


class StackedWeights(Sequence):
    """E weights read on demand by `read(e)`; `map(fn)` composes a conversion (still lazy)."""

    def __init__(self, read: Callable[[int], Any], count: int) -> None:
        self._read, self._count = read, count

    def __len__(self) -> int:
        return self._count

    def __getitem__(self, index: Any) -> Any:
        if not isinstance(index, int):
            raise TypeError("stacked weights are taken one index at a time")
        if not 0 <= index < self._count:
            raise IndexError(index)
        return self._read(index)

    def map(self, fn: Callable[[Any], Any]) -> StackedWeights:
        return StackedWeights(lambda e: fn(self._read(e)), self._count)
