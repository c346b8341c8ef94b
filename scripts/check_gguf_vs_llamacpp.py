"""Lantern against llama.cpp itself on the tests' tiny GGUF files: the check the tests cannot make in CI (no
llama.cpp build there). The tests prove Lantern computes what transformers computes on a file's values; this proves
the files mean the same to llama.cpp, i.e. that the tests' converters (tests/fixtures/gguf_*.py) write what
llama.cpp's converter writes and Lantern reads it as llama.cpp's runtime does.

For each family: llama-server on the float32 file, then at each of --steps greedy positions (teacher-forced on
Lantern's tokens, one token per request so that llama.cpp's UTF-8 buffering cannot shift its probabilities) the
argmax and its log-probability from both. A differing argmax whose two candidates are closer than --tie in
Lantern is a tie (llama.cpp's GELU table and f16 paths move values by ~1e-3), anything else a difference.
Tokenizers: each tokenizer.ggml.pre name of gguf_pretokenize.SPLITS against llama-server's /tokenize.
Rerankers (--rerankers): llama-server --reranking's /v1/rerank scores on the tests' reranker GGUFs.

  python scripts/check_gguf_vs_llamacpp.py --server PATH/TO/llama-server            # every family
  python scripts/check_gguf_vs_llamacpp.py --server ... --only glm4 mamba --steps 24
  python scripts/check_gguf_vs_llamacpp.py --server ... --tokenizers                # the pre-tokenizer splits only

llama.cpp refuses some tiny files by its own shape rules (Phi-2 / GPT-2 / Falcon-7B: an MLP of 4 x hidden; Qwen3-Next:
value heads as wide as key heads; Command R+ q/k norms only at 64 layers; DeepSeek-V2 without q_lora_rank only at
26-27 layers): those print as refused with llama.cpp's reason. Two tiny files differ by llama.cpp's shortcuts, not
in what they hold: olmo3 (llama.cpp rotates the sliding layers with the full layers' base, reading rope.freq_base_swa
but not using it: the same 16 tokens when both bases are 500000, as OLMo 3's are) and exaone4 (llama.cpp slides
only in a 64-layer EXAONE 4, so the tiny file's sliding and NoPE layers run as full rope layers there). phimoe differs
by llama.cpp's graph, not the file: it runs Phi-3.5-MoE's LayerNorms as RMS norms and its SparseMixer as a
renormalised softmax top-2 (Lantern computes the checkpoint's maths, as transformers does).

Compared with float32 K/V and no flash attention (--f16-attention: llama-server's defaults, whose float16 rounding
moves log-probs by up to 0.05 through HRM-Text's 12 passes): most families then agree to 1e-4.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

PROMPT = [5, 77, 123, 42, 300, 17, 9, 250, 31, 64]


def families() -> dict[str, Callable[[Path], Path]]:
    """name -> a function writing that family's tiny float32 GGUF under a folder (as the tests write it)."""
    from tests.fixtures.gguf_bitnet import bitnet_gguf
    from tests.fixtures.gguf_cohere2moe import convert_cohere2moe
    from tests.fixtures.gguf_dbrx import convert_dbrx
    from tests.fixtures.gguf_exaone_moe import convert_exaone_moe
    from tests.fixtures.gguf_families import convert_to_gguf
    from tests.fixtures.gguf_gpt_families import convert_gpt_to_gguf
    from tests.fixtures.gguf_granite import convert_granite
    from tests.fixtures.gguf_hrm_text import convert_hrm_text, hrm_text_folder
    from tests.fixtures.gguf_hy_v3 import convert_hy_v3
    from tests.fixtures.gguf_kimi_linear import convert_kimi_linear, kimi_linear_folder
    from tests.fixtures.gguf_laguna import convert_laguna
    from tests.fixtures.gguf_llama_relatives import convert
    from tests.fixtures.gguf_mamba import convert_mamba
    from tests.fixtures.gguf_mimo2 import convert_mimo2
    from tests.fixtures.gguf_openelm import convert_openelm
    from tests.fixtures.gguf_phimoe import convert_phimoe
    from tests.fixtures.gguf_qwen3_next import convert_qwen3_next
    from tests.fixtures.gguf_renamed import convert_bailing, convert_minicpm3
    from tests.fixtures.gguf_step35 import convert_step35
    from tests.fixtures.nemotron_nas import LLAMA_CPP_BLOCKS, convert_deci, write_folder
    from tests.fixtures.rwkv_world import convert_rwkv7
    from tests.fixtures.tiny_models import ARCH_VARIANTS, build_model
    from tests.models.test_deepseek_moe import convert_deepseek, deepseek_folder
    from tests.models.test_gguf_families import FILES
    from tests.models.test_gguf_gpt_classics import FILES as GPT
    from tests.models.test_gguf_llama_relatives import CASES as LLAMA_RELATIVES
    from tests.models.test_gguf_mamba import FILES as MAMBA
    from tests.models.test_gguf_qwen3_next import FILES as QWEN3_NEXT
    from tests.models.test_ling1 import convert_ling1, ling1_folder
    from tests.models.test_muse_glimmer import convert_muse_glimmer, muse_glimmer_folder
    from tests.models.test_nanbeige import CASES as NANBEIGE
    from tests.models.test_nanbeige import convert_nanbeige, nanbeige_folder
    from tests.models.test_openelm import openelm_folder
    from tests.models.test_rwkv7 import rwkv7_folder
    from tests.models.test_step3p5 import step3p5_folder
    from tests.models.test_talkie import convert_talkie, talkie_folder

    made: dict[str, Callable[[Path], Path]] = {}
    for name, (variant, overrides, _, options) in FILES.items():
        made[name] = lambda d, v=variant, o=overrides, k=options: convert_to_gguf(
            build_model(v, d / "hf", **o), d, **k
        )[0]
    for name, (variant, overrides, outtype) in GPT.items():
        if outtype != "q8_0":
            made[name] = lambda d, v=variant, o=overrides: convert_gpt_to_gguf(build_model(v, d / "hf", **o), d)[0]
    for name, (variant, _) in MAMBA.items():
        made[name] = lambda d, v=variant: convert_mamba(build_model(v, d / "hf"), d)[0]
    for name, (variant, overrides, _, options) in QWEN3_NEXT.items():
        made[name] = lambda d, v=variant, o=overrides, k=options: convert_qwen3_next(
            build_model(v, d / "hf", **o), d, **k
        )[0]
    for name in ("granite_swa", "granitemoe_swa_shared", "granitemoeshared"):  # (tests/models/test_granite_relatives)
        made[name] = lambda d, v=name: convert_granite(build_model(v, d / "hf"), d, "f32")[0]
    scalars = {"scale_emb": 12, "scale_depth": 1.4, "dim_model_base": 256}  # (llama.cpp's minicpm3 constants)
    made["minicpm3"] = lambda d: convert_minicpm3(build_model("minicpm3", d / "hf", **scalars), d)[0]
    made["exaone_moe"] = lambda d: convert_exaone_moe(build_model("exaone_moe", d / "hf"), d)[0]
    rope = {**ARCH_VARIANTS["mistral4"][1]["rope_parameters"], "llama_4_scaling_beta": 0.0}  # (no temperature key)
    made["mistral4"] = lambda d: convert_to_gguf(build_model("mistral4", d / "hf", rope_parameters=rope), d)[0]
    for name, partial in (("bailingmoe2", 0.5), ("bailingmoe2_sarvam", 1.0)):  # (tests/models/test_renamed_families)
        made[name] = lambda d, p=partial: convert_bailing(
            build_model("sarvam_moe", d / "hf", partial_rotary_factor=p, head_dim=16, attention_bias=False), d
        )[0]
    for name, (variant, overrides) in LLAMA_RELATIVES.items():  # internlm2, xverse, orion, qwen, minicpm
        made[name] = lambda d, n=name, v=variant, o=overrides: convert(
            build_model(v, d / "hf", **o), d / f"tiny-{n}.gguf", n.split("_")[0]
        )
    made["deci"] = lambda d: convert_deci(write_folder(d / "hf", LLAMA_CPP_BLOCKS)[0], d / "tiny-deci.gguf")
    made["cohere2moe"] = lambda d: convert_cohere2moe(build_model("cohere2_moe_rms", d / "hf"), d / "tiny-c2moe.gguf")
    made["mimo2"] = lambda d: convert_mimo2(build_model("mimo_v2_flash", d / "hf"), d / "tiny-mimo2.gguf")
    made["dbrx"] = lambda d: convert_dbrx(build_model("dbrx", d / "hf"), d / "tiny-dbrx.gguf")
    made["hrm_text"] = lambda d: convert_hrm_text(hrm_text_folder(d / "hf")[0], d / "tiny-hrm-text.gguf")
    made["kimi_linear"] = lambda d: convert_kimi_linear(
        kimi_linear_folder(d / "hf", n_group=1)[0], d / "tiny-kimi-linear.gguf"
    )
    made["openelm"] = lambda d: convert_openelm(openelm_folder(d / "hf"), d / "tiny-openelm.gguf")
    made["muse_glimmer"] = lambda d: convert_muse_glimmer(
        muse_glimmer_folder(d / "hf", post_norm_eps=1e-8)[0], d / "tiny-muse-glimmer.gguf"
    )
    made["phimoe"] = lambda d: convert_phimoe(build_model("phimoe", d / "hf", router_jitter_noise=0.01), d / "pm.gguf")
    for gating in (True, "per-element"):  # (tests/models/test_laguna.py's: XS.2's layer pattern, no router cap)
        made[f"laguna_{'head' if gating is True else 'channel'}"] = lambda d, g=gating: convert_laguna(
            build_model(
                "laguna",
                d / "hf",
                layer_types=["full_attention"] + ["sliding_attention"] * 3,
                num_attention_heads_per_layer=[8, 4, 4, 4],
                moe_router_logit_softcapping=0.0,
                gating=g,
            ),
            d / "tiny-laguna.gguf",
        )
    made["hy_v3"] = lambda d: convert_hy_v3(  # (tests/models/test_hy_v3.py's)
        build_model("hy_v3", d / "hf", num_hidden_layers=3, mlp_layer_types=["sparse", "dense", "sparse"]),
        d / "tiny-hy-v3.gguf",
    )
    made["step35"] = lambda d: convert_step35(step3p5_folder(d / "hf"), d / "tiny-step35.gguf")
    made["ling1"] = lambda d: convert_ling1(  # (tests/models/test_ling1.py's)
        ling1_folder(d / "hf", rotary_dim=None, first_k_dense_replace=0), d / "tiny-ling1.gguf"
    )
    made["deepseek"] = lambda d: convert_deepseek(deepseek_folder(d / "hf"), d / "tiny-deepseek.gguf")
    made["rwkv7"] = lambda d: convert_rwkv7(rwkv7_folder(d / "hf", world=1000), d / "tiny-rwkv7.gguf")
    made["talkie"] = lambda d: convert_talkie(talkie_folder(d / "hf"), d / "tiny-talkie.gguf")
    for case, loops in NANBEIGE.items():  # (tests/models/test_nanbeige.py)
        made[f"nanbeige_{case}"] = lambda d, k=loops: convert_nanbeige(
            nanbeige_folder(d / "hf", bias=False, **k), d / "nb.gguf"
        )
    for qtype in ("F32", "TQ2_0", "TQ1_0"):  # (tests/models/test_bitnet.py)
        made[f"bitnet_{qtype.lower()}"] = lambda d, q=qtype: bitnet_gguf(d, q)[0]
    return made


class Server:
    def __init__(self, binary: str, model: Path, port: int, log: Path, extra: tuple[str, ...] = ()):
        self.url = f"http://127.0.0.1:{port}"
        args = [binary, "-m", str(model), "--port", str(port), "-c", "512", "-t", "1", "--temp", "0", *extra]
        self.log = log
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=open(log, "w"))

    def wait(self) -> str | None:
        """None once serving; else llama.cpp's first error line."""
        import httpx

        for _ in range(200):
            try:
                if httpx.get(f"{self.url}/health").status_code == 200:
                    return None
            except httpx.HTTPError:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        errors = [line.split(": ", 2)[-1] for line in self.log.read_text().splitlines() if " E " in line]
        return errors[0] if errors else "did not start"

    def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        return httpx.post(f"{self.url}{path}", json=body, timeout=120).json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait()


def check_family(name: str, make: Callable[[Path], Path], args: argparse.Namespace, root: Path) -> str:
    from lantern.app.engine import LLM, SamplingParams

    folder = root / name
    folder.mkdir(parents=True)
    path = make(folder)
    exact = () if args.f16_attention else ("-ctk", "f32", "-ctv", "f32", "-fa", "off")
    server = Server(args.server, path, args.port, folder / "llama-server.log", exact)
    try:
        refused = server.wait()
        if refused:
            return f"refused by llama.cpp: {refused}"
        llm = LLM(model=str(path), backend=args.backend, dtype="float32", block_size=4)
        params = SamplingParams(max_tokens=args.steps, temperature=0, ignore_eos=True, logprobs=2)
        ours = llm.generate(PROMPT, params)[0].outputs[0]
        ties, worst = 0, 0.0
        for i, token in enumerate(ours.token_ids):
            body = {"prompt": PROMPT + list(ours.token_ids[:i]), "n_predict": 1, "n_probs": 2, "temperature": 0}
            reply = server.post("/completion", {**body, "top_k": 1, "return_tokens": True, "cache_prompt": False})
            theirs = reply["tokens"][0]
            top = sorted(ours.logprobs[i].top.values(), reverse=True)
            probs = reply.get("completion_probabilities") or []
            if probs and theirs == token:
                worst = max(worst, abs(probs[0]["logprob"] - ours.logprobs[i].logprob))
            if theirs != token:
                if len(top) > 1 and top[0] - top[1] < args.tie:
                    ties += 1
                    continue
                return f"DIFFERS at step {i}: llama.cpp {theirs}, Lantern {token} (Lantern's top two {top[:2]})"
        tie_note = f", {ties} near-tie(s)" if ties else ""
        return f"same {len(ours.token_ids)} greedy tokens (largest log-prob gap {worst:.4f}{tie_note})"
    finally:
        server.stop()


def check_tokenizers(args: argparse.Namespace, root: Path) -> None:
    from lantern.app.models.gguf_pretokenize import IGNORE_MERGES, SPLITS
    from lantern.app.models.loader import resolve_model
    from tests.fixtures.gguf_writer import write_gguf_model
    from tests.models.test_gguf_pretokenize import TEXTS

    for pre in sorted(set(SPLITS) | IGNORE_MERGES):
        path, _ = write_gguf_model(root / f"pre-{pre}", arch="llama", qtype="Q8_0", pre=pre)
        server = Server(args.server, path, args.port, root / f"pre-{pre}.log")
        try:
            refused = server.wait()
            if refused:
                print(f"tokenizer {pre}: refused by llama.cpp: {refused}")
                continue
            tokenizer = resolve_model(str(path)).tokenizer
            same = sum(
                server.post("/tokenize", {"content": t, "add_special": False})["tokens"]
                == tokenizer.encode(t, add_special_tokens=False)
                for t in TEXTS
            )
            print(f"tokenizer {pre}: {same}/{len(TEXTS)} texts give llama.cpp's ids", flush=True)
        finally:
            server.stop()


RERANK_QUERY = "what does paged attention keep"
RERANK_DOCS = [
    "Paged attention keeps every sequence in fixed blocks so memory is never fragmented.",
    "The quick brown fox jumps over the lazy dog.",
    "Numbers 0123456789",
]


def rerankers(root: Path) -> dict[str, Path]:
    """The tests' reranker GGUFs: bge-reranker's XLM-R (f32, Q8_0), gte-reranker-modernbert's ModernBERT,
    Qwen3-Reranker (tests/models/test_rerankers.py, test_gguf_modernbert.py)."""
    from transformers import AutoTokenizer

    from lantern.app.models.qwen3_reranker import TEMPLATE
    from tests.fixtures.gguf_encoders import convert_encoder_to_gguf, convert_modernbert_to_gguf
    from tests.fixtures.gguf_families import convert_to_gguf
    from tests.fixtures.tiny_rerankers import build_cross_encoder, build_qwen3_reranker

    xlmr = build_cross_encoder(root / "xlmr", "xlm-roberta", seed=4, max_position_embeddings=258)
    out = {f"xlmr-{t}": convert_encoder_to_gguf(xlmr, root / f"xlmr-{t}", t)[0] for t in ("f32", "q8_0")}
    modern = build_cross_encoder(root / "modern", "modernbert", seed=3, bpe=True, classifier_pooling="mean")
    out["modern-bert"] = convert_modernbert_to_gguf(modern, root / "modern-gguf", "f32")[0]
    qwen = build_qwen3_reranker(root / "Qwen3-Reranker-tiny", seed=2, tie=True)
    tok = AutoTokenizer.from_pretrained(qwen)
    rows = (tok.convert_tokens_to_ids("yes"), tok.convert_tokens_to_ids("no"))
    out["qwen3-reranker"] = convert_to_gguf(qwen, root / "qwen3", "f32", rerank={"rows": rows, "template": TEMPLATE})[0]
    return out


def check_rerankers(args: argparse.Namespace, root: Path) -> None:
    """llama-server --reranking's /v1/rerank scores against Lantern's: its raw logit for a cross-encoder (Lantern's
    sigmoid undone), P(yes) for Qwen3-Reranker; and, for the prompt reranker, Lantern's score on llama.cpp's own
    tokens of the prompt (the tests' byte-level BPE is written with pre "default", which llama.cpp splits by its own
    regex, unlike the tokenizer the file came from: a fixture's difference, not a real Qwen3 file's)."""
    import math

    from lantern.app.engine import LLM
    from lantern.app.engine.embedding import run_offline
    from lantern.app.engine.scoring import tokenize_pair

    for name, path in rerankers(root / "rerankers").items():
        server = Server(args.server, path, args.port, root / f"{name}.log", ("--reranking", "-ub", "512"))
        try:
            refused = server.wait()
            if refused:
                print(f"reranker {name}: refused by llama.cpp: {refused}")
                continue
            reply = server.post("/v1/rerank", {"query": RERANK_QUERY, "documents": RERANK_DOCS})
            theirs = [s for _, s in sorted((r["index"], r["relevance_score"]) for r in reply["results"])]
            llm = LLM(model=str(path), backend=args.backend, dtype="float32")
            ours = [o.score for o in llm.score(RERANK_QUERY, RERANK_DOCS)]
            note = ""
            if name.startswith(("xlmr", "modern")):
                ours = [math.log(p / (1 - p)) for p in ours]
            else:
                template = llm.engine.embedder.pair_template
                texts = [template.replace("{query}", RERANK_QUERY).replace("{document}", d) for d in RERANK_DOCS]
                body = {"add_special": False, "parse_special": True}
                tokens = [server.post("/tokenize", {"content": t, **body})["tokens"] for t in texts]
                same = sum(t == tokenize_pair(llm.engine, RERANK_QUERY, d)[0] for t, d in zip(tokens, RERANK_DOCS))
                on_theirs = run_offline(llm.engine, llm.engine.embedder, [(t, None) for t in tokens])
                gap = max(abs(o.score - s) for o, s in zip(on_theirs, theirs))
                note = f"; {same}/{len(tokens)} prompts tokenized alike, gap {gap:.2e} on llama.cpp's tokens"
            gap = max(abs(a - b) for a, b in zip(ours, theirs))
            print(f"reranker {name}: largest score gap {gap:.2e} over {len(RERANK_DOCS)} documents{note}", flush=True)
        finally:
            server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--server", required=True, help="a llama-server binary")
    parser.add_argument("--only", nargs="*", help="family names (default: all)")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--tie", type=float, default=0.02, help="log-prob gap under which a flip is a tie")
    parser.add_argument("--backend", default="torch", choices=["torch", "mlx"])
    parser.add_argument("--port", type=int, default=18190)
    parser.add_argument("--f16-attention", action="store_true", help="llama-server's default f16 KV and attention")
    parser.add_argument("--no-tokenizers", action="store_true")
    parser.add_argument("--rerankers", action="store_true", help="only the reranker GGUFs' scores")
    parser.add_argument("--tokenizers", action="store_true", help="only the tokenizer.ggml.pre splits")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="gguf-vs-llamacpp-"))
    os.environ.setdefault("LANTERN_CACHE", str(root / "cache"))
    try:
        if args.rerankers:
            check_rerankers(args, root)
            return
        if args.tokenizers:
            check_tokenizers(args, root)
            return
        for name, make in families().items():
            if args.only and name not in args.only:
                continue
            try:
                print(f"{name}: {check_family(name, make, args, root)}", flush=True)
            except Exception as exc:  # one family's failure is reported, the sweep goes on
                print(f"{name}: ERROR {exc!r}", flush=True)
        if not args.no_tokenizers and not args.only:
            check_tokenizers(args, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
