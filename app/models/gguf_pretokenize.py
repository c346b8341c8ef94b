"""How a byte-level BPE GGUF splits text before its merges, for the `tokenizer.ggml.pre` names transformers'
GGUF reader does not know.

transformers rebuilds a GGUF's BPE tokenizer with a split regex for a few pre-tokenizer names (llama3, qwen2,
tekken, gpt-4o, ...) and GPT-2's for every other name. llama.cpp (which wrote the name, and runs the file) splits
DeepSeek-V3, GLM-4, StableLM 2, Hunyuan, Falcon, BLOOM, Seed-Coder, StarCoder / SmolLM / Command-R / EXAONE and
Jais 2 vocabularies otherwise: digits in groups of three or one by one, CJK runs apart, punctuation alone. With
GPT-2's split a number or a CJK sentence comes out as other tokens than the model was trained on. The regexes
below are those models' own tokenizer.json pre-tokenizers, as llama.cpp's llama-vocab.cpp lists them per name;
several apply in sequence, each splitting the pieces of the one before (tokenizers' Split, isolated).

llama.cpp also takes a whole word from the vocabulary before merging (ignore_merges, as those tokenizer.json
files say) for the Llama 3 family and GLM-4.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_JAIS2 = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s{512}(?!\S)|\s{256}(?!\S)|\s{128}(?!\S)|\s{64}(?!\S)|\s{32}(?!\S)|\s{16}(?!\S)|\s{8}(?!\S)|\s{4}(?!\S)"
    r"|\s{1,2}(?!\S)|\s{1}"
)
_SEED_CODER = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_DEEPSEEK3 = (
    r"\p{N}{1,3}",
    "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"""
    r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
_CJK_HANGUL = "[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"
_DEEPSEEK_LLM = (
    "[\r\n]",
    "\\s?[A-Za-z\u00b5\u00c0-\u00d6\u00d8-\u00f6\u00f8-\u01ba\u01bc-\u01bf\u01c4-\u0293\u0295-\u02af\u0370-\u0373"
    "\u0376\u0377\u037b-\u037d\u037f\u0386\u0388-\u038a\u038c\u038e-\u03a1\u03a3-\u03f5\u03f7-\u0481\u048a-\u052f"
    "\u0531-\u0556\u10a0-\u10c5\u13a0-\u13f5\u13f8-\u13fd\u1c90-\u1cba\u1cbd-\u1cbf\u1d00-\u1d2b\u1d6b-\u1d77"
    "\u1d79-\u1d9a\u1e00-\u1f15\u1f18-\u1f1d\u1f20-\u1f45\u1f48-\u1f4d\u1f50-\u1f57\u1f59\u1f5b\u1f5d\u1f5f-\u1f7d"
    "\u1f80-\u1fb4\u1fb6-\u1fbc\u1fbe\u1fc2-\u1fc4\u1fc6-\u1fcc\u1fd0-\u1fd3\u1fd6-\u1fdb\u1fe0-\u1fec\u1ff2-\u1ff4"
    "\u1ff6-\u1ffc\u2102\u2107\u210a-\u2113\u2115\u2119-\u211d\u2124\u2126\u2128\u212a-\u212d\u212f-\u2134\u2139"
    "\u213c-\u213f\u2145-\u2149\u214e\u2183\u2184\u2c00-\u2c7b\u2c7e-\u2ce4\u2ceb-\u2cee\u2cf2\u2cf3\ua640-\ua66d"
    "\ua680-\ua69b\ua722-\ua76f\ua771-\ua787\ua78b-\ua78e\uab70-\uabbf\ufb00-\ufb06\ufb13-\ufb17\uff21-\uff3a"
    "\uff41-\uff5a\U00010400-\U0001044f\U000104b0-\U000104d3\U000104d8-\U000104fb\U00010c80-\U00010cb2"
    "\U00010cc0-\U00010cf2\U000118a0-\U000118df\U0001e900-\U0001e943]+",
    "\\s?[!-/:-~\uff01-\uff0f\uff1a-\uff5e\u2018-\u201f\u3000-\u3002]+",
    r"\s+$",
    _CJK_HANGUL,
    r"\p{N}+",
)
_DEEPSEEK_CODER = ("[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK_HANGUL, r"\p{N}")
_FALCON = (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, "[0-9][0-9][0-9]")
_DIGITS_THEN_GPT2 = (r"\p{N}", _GPT2)
# Arcee Trinity: numbers in groups of three from the right ("12345" -> "12", "345": llama.cpp's AFMoE_digits),
# CJK / Thai / Lao / Khmer / Myanmar / Hangul runs apart, then DeepSeek-V3's words and punctuation
_AFMOE = (
    r"\p{N}{1,3}(?=(?:\p{N}{3})*(?!\p{N}))",
    "[\u4e00-\u9fff\u3400-\u4dbf\uf900-\ufaff\u3040-\u309f\u30a0-\u30ff\uff65-\uff9f\u2f00-\u2fdf\u0e40-\u0e7f"
    "\u0e80-\u0eff\u1780-\u17ff\u1000-\u109f\uaa60-\uaa7f\ua9e0-\ua9ff\uac00-\ud7af\u1100-\u11ff]+",
    _DEEPSEEK3[2],
)
_BLOOM = (" ?[^(\\s|.,!?\u2026\u3002\uff0c\u3001\u0964\u06d4\u060c)]+",)
_CASED = (  # GPT-4o's words (a cased run, its contraction), as llama.cpp spells the contraction
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?"
)
_TAIL = r" ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Talkie: GPT-4o's split (llama.cpp's GPT4O pre-type; transformers knows it only as gpt-4o / llama4 / kanana2)
_GPT4O = (_CASED + r"|\p{N}{1,3}|" + _TAIL,)
# Ling / Ring (bailingmoe, bailingmoe2) and LLaDA-MoE: Qwen2's with one newline at a time
_BAILING = (
    r"'(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]|\s+(?!\S)|\s+",
)
# K-EXAONE: words that run on over single spaces, marks attached
_EXAONE_MOE = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?(?:\p{L}\p{M}*(?: \p{L}\p{M}*)*)+"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]?|\s*[\r\n]|\s+(?!\S)|\s+",
)
# Kimi K2 (its tokenization_kimi.py; llama.cpp's custom split): Han runs apart, GPT-4o's words without Han
_KIMI_K2 = (
    r"[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+"
    r"[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# MiniCPM 5: digits in threes, then Qwen2's words with whole numbers
_MINICPM5 = (
    r"\p{N}{1,3}",
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}+"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
)
# Tiny Aya / Cohere2-MoE: numbers in threes from the right, then GPT-4o's split
_TINY_AYA = (r"\d{1,3}(?=(?:\d{3})*\b)", _CASED + r"|\p{N}{1,3}|" + _TAIL)
# Youtu-LLM: Hangul, CJK punctuation, Bopomofo and CJK runs apart, then GPT-4o's words with single digits
_YOUTU = (
    "[\uac00-\ud7a3\u3131-\u318e]+|[\uff01\u2026\u201c\u201d\u2018\u2019\u2014\uff1a\uff1b\uff0c\u3001-\u303f"
    "\ufe30-\ufe4f]+|[\u3105-\u312f]+|[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
    _CASED + r"|\p{N}|" + _TAIL,
)
# Spark 2.5: DeepSeek-V3's with each newline and digit apart
_SPARK = (
    _DEEPSEEK3[0],
    _DEEPSEEK3[1],
    r"""[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+"""
    r"|[\r\n]|\s+(?!\S)|\s+",
    r"\p{N}",
)
# UFAKZEKA (Turkish): Qwen2's without the English contractions
_UFAKZEKA = (r"[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",)

SPLITS: dict[str, tuple[str, ...]] = {
    **dict.fromkeys(("chatglm-bpe", "glm4", "glm5"), (_LLAMA3,)),
    **dict.fromkeys(("stablelm2", "hunyuan", "solar-open"), (_QWEN2,)),
    "jais-2": (_JAIS2,),
    "seed-coder": (_SEED_CODER,),
    **dict.fromkeys(("deepseek-v3", "hunyuan-dense"), _DEEPSEEK3),
    "deepseek-llm": _DEEPSEEK_LLM,
    "deepseek-coder": _DEEPSEEK_CODER,
    "falcon": _FALCON,
    "afmoe": _AFMOE,
    **dict.fromkeys(
        ("starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b", "mellum2"),
        _DIGITS_THEN_GPT2,
    ),
    **dict.fromkeys(("bloom", "poro-chat", "gpt3-finnish"), _BLOOM),
    "viking": (*_BLOOM, r"\p{N}"),
    **dict.fromkeys(("bailingmoe", "bailingmoe2", "llada-moe"), _BAILING),
    "exaone-moe": _EXAONE_MOE,
    "grok-2": (_QWEN2,),
    "laguna": ("[^\n]+|[\n]+", _QWEN2),
    **dict.fromkeys(("hy_v4", "joyai-llm"), _DEEPSEEK3),
    "spark2_5": _SPARK,
    "kimi-k2": _KIMI_K2,
    "minicpm5": _MINICPM5,
    **dict.fromkeys(("tiny_aya", "cohere2moe"), _TINY_AYA),
    "youtu": _YOUTU,
    "ufakzeka": _UFAKZEKA,
    "talkie": _GPT4O,
}
IGNORE_MERGES = frozenset(
    ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano")
    + ("glm4", "glm5", "tekken", "minicpm5", "youtu")
)


# Byte-level BPE names llama.cpp tokenizes in ways not rebuilt here: refused rather than split as GPT-2
_NOT_REBUILT = {
    "sarvam-moe": "BPE over raw UTF-8 with spaces as U+2581 (SentencePiece-style)",
    "gemma4": "BPE over raw UTF-8 with spaces as U+2581 (SentencePiece-style)",
    "granite-embed-multi-311m": "BPE over raw UTF-8 with spaces as U+2581 (SentencePiece-style)",
    "superbpe": "digits split by a zero-width lookahead",
    "chameleon": "image sentinel tokens",
    "granite-embed-multi-97m": "GPT-4o's split with combining marks",
}


def apply_llama_cpp_split(tokenizer: Any, metadata: dict[str, Any]) -> None:
    """Give a byte-level BPE tokenizer built from a GGUF the split (and ignore_merges) llama.cpp uses for its
    tokenizer.ggml.pre, where SPLITS / IGNORE_MERGES name it; other tokenizers are left as they are, but for the
    names refused in one line (_NOT_REBUILT)."""
    from tokenizers import Regex, pre_tokenizers

    from lantern.app.models.spec import UnsupportedModelError

    pre = metadata.get("tokenizer.ggml.pre")
    if metadata.get("tokenizer.ggml.model") == "gpt2" and pre in _NOT_REBUILT:
        raise UnsupportedModelError(
            f"GGUF tokenizer.ggml.pre={pre!r} ({_NOT_REBUILT[pre]}) is not implemented: its text would be split "
            "into other tokens than llama.cpp's"
        )
    if metadata.get("tokenizer.ggml.model") != "gpt2" or (pre not in SPLITS and pre not in IGNORE_MERGES):
        return
    backend = tokenizer.backend_tokenizer
    if pre in SPLITS:
        splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in SPLITS[pre]]
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
    if pre in IGNORE_MERGES:
        backend.model.ignore_merges = True
    logger.info(
        "GGUF tokenizer: llama.cpp's %r pre-tokenizer split%s", pre, " (whole words first)" * (pre in IGNORE_MERGES)
    )
