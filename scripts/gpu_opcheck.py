"""pytest plugin for the GPU device: every CUDA call of the torch backend's ops (kernels/ops.py:
rms_norm, rotary, paged_prefill, paged_decode; reference.causal_attention and sdpa_grouped) is
recomputed on the CPU and the largest difference written to $OUT/opcheck.txt, per test. It tells a
kernel bug on the GPU from a reference that differs there (session 18: the device's transformers).

  cp scripts/gpu_opcheck.py <site on PYTHONPATH>/ && python3 -m pytest -m gpu -p gpu_opcheck tests/conformance/...
"""

import os

import torch

from lantern.backends.torch.kernels import ops, reference

LOG = open(os.path.join(os.environ.get("OUT", "/tmp"), "opcheck.txt"), "a")
seen: dict = {}


def _cpu(v):
    if isinstance(v, torch.Tensor):
        return v.detach().cpu()
    if isinstance(v, (list, tuple)):
        return type(v)(_cpu(x) for x in v)
    return v


def _flat(v):
    return list(v) if isinstance(v, (list, tuple)) else [v]


def _wrap(mod, name, drop=()):
    orig = getattr(mod, name)

    def wrapped(*a, **kw):
        out = orig(*a, **kw)
        first = next((x for x in a if isinstance(x, torch.Tensor)), None)
        if first is None or not first.is_cuda:
            return out
        ca = [_cpu(x) for x in a]
        ckw = {k: _cpu(v) for k, v in kw.items() if k not in drop}
        ref = orig(*ca, **ckw)
        diffs = []
        for o, r in zip(_flat(out), _flat(ref)):
            if isinstance(o, torch.Tensor):
                diffs.append(float((o.detach().cpu().double() - r.double()).abs().max()) if o.numel() else 0.0)
        extras = {k: (tuple(v.shape) if isinstance(v, torch.Tensor) else v) for k, v in kw.items() if k not in drop}
        key = (name, tuple(tuple(x.shape) for x in a if isinstance(x, torch.Tensor))[:2], str(extras))
        seen[key] = seen.get(key, 0) + 1
        if seen[key] <= 2 or max(diffs, default=0) > 1e-3:
            plain = [x for x in a if not isinstance(x, torch.Tensor)]
            LOG.write(f"{name} shapes={key[1]} dtype={first.dtype} extras={extras} args={plain} maxdiff={diffs}\n")
            LOG.flush()
        return out

    setattr(mod, name, wrapped)


def pytest_configure(config):
    for n in ("rms_norm", "rotary", "paged_prefill"):
        _wrap(ops, n, drop=("step_cache",))
    _wrap(ops, "paged_decode", drop=("ctx_cache", "native"))
    _wrap(reference, "causal_attention")
    _wrap(reference, "sdpa_grouped")


def pytest_runtest_setup(item):
    LOG.write(f"=== {item.nodeid}\n")
    LOG.flush()
