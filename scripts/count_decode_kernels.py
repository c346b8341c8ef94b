"""The Triton kernels one decode step launches on the torch backend's CUDA path, counted on a CPU.

At batch 1 on a GPU each launch inside the decode CUDA graph costs ~1.5-2 us whatever it does, so the count per
layer is what the non-GEMV part of a token costs. Here the CUDA path runs in Triton's interpreter: ops.use_triton is
forced on, the CPU attention kernels off, the quantized layers forced to the CUDA layer (TritonLinear), and every
kernel launch of the step after the prompt is counted by name.

  TRITON_INTERPRET=1 python scripts/count_decode_kernels.py                       # tiny llama3, 4 layers, --isq q4
  TRITON_INTERPRET=1 python scripts/count_decode_kernels.py --variant qwen2 --isq none --dtype float32

Prints one JSON object: the kernels and their launches, the layers, launches a layer (the step's total less the
head's GEMV and the final norm, over the layers).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", default="llama3", help="a tests/fixtures/tiny_models.py variant")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--isq", default="q4", choices=("q4", "q8", "none"))
    p.add_argument(
        "--dtype", default="float16", choices=("float16", "float32"), help="(no bfloat16 in the interpreter)"
    )
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") != "1":
        p.error("set TRITON_INTERPRET=1 (before Python starts): the kernels run in Triton's interpreter")

    from triton.runtime.interpreter import InterpretedFunction

    from lantern.app.engine import LLM, SamplingParams
    from lantern.backends.torch import cpu_attention, quant_linear
    from tests.fixtures.tiny_models import build_model

    counts: collections.Counter[str] = collections.Counter()
    counting = [False]
    launch = InterpretedFunction.run

    def counted_launch(self, *a, **kw):
        if counting[0]:
            counts[self.fn.__name__] += 1
        return launch(self, *a, **kw)

    with tempfile.TemporaryDirectory() as tmp:
        path = build_model(args.variant, Path(tmp) / args.variant, num_hidden_layers=args.layers)
        with (
            mock.patch("lantern.backends.torch.kernels.ops.use_triton", lambda t: True),
            mock.patch.object(cpu_attention, "serves", lambda *a, **kw: False),
            mock.patch.object(quant_linear, "select_kernel", lambda w, d: "triton"),
            mock.patch.object(InterpretedFunction, "run", counted_launch),
        ):
            llm = LLM(
                str(path),
                backend="torch",
                dtype=args.dtype,
                quantization=None if args.isq == "none" else args.isq,
                block_size=16,
                num_kv_blocks=64,
            )
            backend = llm.engine.backend
            launch_step, steps = backend.launch, []

            def one_decode_step(batch, after=None):  # (the engine launches every step: base.LaunchingBackend)
                counting[0] = batch.num_tokens == batch.num_seqs and not any(steps)  # the first decode step only
                steps.append(counting[0])
                try:
                    return launch_step(batch, after)
                finally:
                    counting[0] = False

            backend.launch = one_decode_step
            llm.generate(
                ["hello there, how are you doing today? tell me a story"],
                SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
            )
            llm.engine.shutdown()
    total = sum(counts.values())
    outside = counts.get("_gemv_dp4a_kernel", 0) and 1  # the head's GEMV (quantized heads) ...
    outside += 1 if counts.get("_rms_norm_kernel") else 0  # ... and the final norm
    result = {
        "kernels": dict(counts.most_common()),
        "layers": args.layers,
        "total": total,
        "per_layer": (total - outside) / args.layers,
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
