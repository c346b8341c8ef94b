"""Programmatic dependent launch (PDL, Hopper and later) for the kernels of a decode step.

A bs=1 decode step of an 8B model is ~260 kernels in a CUDA graph, each a few microseconds: the gap between
two of them -- the next grid's launch and ramp-up after the last block of the one before has finished -- is a
sizeable part of the step. With PDL (the launch attribute `programmatic stream serialization`, Triton's
`launch_pdl=True`) the next kernel is launched once every block of the running one has signalled it may be
(`griddepcontrol.launch_dependents`), and its blocks wait in `griddepcontrol.wait` until that kernel has
finished and its writes are visible. So a PDL-aware kernel here begins with both -- the wait first, before it
reads anything: it is then as safe as a plain launch (each kernel waits for the one before, which waited for its
own predecessor), and what it gains is the launch latency, hidden behind the kernel before it.

`launch(t)`: the keyword arguments that turn it on for a kernel working on tensor t (its constexpr PDL and the
launch option together: a PDL launch of a kernel that does not wait would read stale data). Off on a CPU, before
Hopper, under LANTERN_PDL=0, and once `turn_off` was called (a CUDA-graph capture that refused it).
"""

from __future__ import annotations

import logging
import os
from functools import cache

import torch

logger = logging.getLogger(__name__)

_OFF = {"flag": os.environ.get("LANTERN_PDL", "1") == "0"}


@cache
def _hopper_or_later(index: int) -> bool:
    return torch.cuda.get_device_capability(index)[0] >= 9


def enabled(t: torch.Tensor) -> bool:
    # (ROCm's torch reports CUDA tensors too, MI300 as capability 9.4: griddepcontrol is PTX)
    return t.is_cuda and torch.version.hip is None and not _OFF["flag"] and _hopper_or_later(t.device.index or 0)


def launch(t: torch.Tensor) -> dict[str, bool]:
    """{"PDL": on, "launch_pdl": on} for a PDL-aware kernel launched on t's device (the module's docstring)."""
    on = enabled(t)
    return {"PDL": on, "launch_pdl": on}


def turn_off(reason: str) -> bool:
    """Launch without PDL from now on; False when it was off already (nothing to retry)."""
    if _OFF["flag"]:
        return False
    _OFF["flag"] = True
    logger.warning("programmatic dependent launch turned off: %s", reason)
    return True
