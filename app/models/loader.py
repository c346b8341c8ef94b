"""Resolve a model argument (HF folder, HF hub id, or .gguf file) to a ModelSpec and a tokenizer."""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lantern.app.engine.contract import ModelSpec
from lantern.app.models.spec import ModelConfig, UnsupportedModelError

logger = logging.getLogger(__name__)

_CACHE_FORMAT = 9  # bump when what gguf_config_and_tokenizer stores changes (9: encoders' pair templates)
_HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer.model", "*.jinja", "*.txt"]


class ModelNotFoundError(RuntimeError):
    pass


@dataclass
class LoadedModel:
    spec: ModelSpec
    tokenizer: Any  # a transformers fast tokenizer
    eos_token_ids: list[int]
    chat_template: str | None


def resolve_model(model: str, dtype: str = "float32") -> LoadedModel:
    path = Path(model).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise ModelNotFoundError(f"GGUF file not found: {path}")
        return _load_gguf(path, dtype)
    if path.is_dir():
        return _load_hf_dir(path, path.resolve().name, dtype)
    if path.exists() or model.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"not a model folder or .gguf file: {path}")
    return _load_hf_dir(_download(model), model, dtype)


def _download(repo_id: str) -> Path:
    """From the user's HF cache when present; otherwise from the hub; one clear line on failure."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS, local_files_only=True))
    except Exception as exc:
        logger.debug("%s is not in the local Hugging Face cache: %s", repo_id, exc)
    if os.environ.get("HF_HUB_OFFLINE") == "1":
        raise ModelNotFoundError(f"model {repo_id!r} is not in the local Hugging Face cache (HF_HUB_OFFLINE=1)")
    logger.info("downloading %s from the Hugging Face hub", repo_id)
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ModelNotFoundError(
            f"model {repo_id!r} is not cached locally and could not be downloaded: {reason}"
        ) from None


# Special tokens that end a turn whatever a file's eos ids say, by family (llama.cpp's end-of-generation set
# takes them by text too): Gemma 4's end of turn and its hand-over to a tool after a call.
_TURN_ENDS = {"gemma4": ("<turn|>", "<|tool_response>")}


def _collect_eos(config: ModelConfig, tokenizer: Any, gen_cfg: dict[str, Any]) -> list[int]:
    ids: list[int] = []
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {str(getattr(t, "content", t)): i for i, t in added.items() if getattr(t, "special", False)}
    turn_ends = [special[t] for t in _TURN_ENDS.get(config.family, ()) if t in special]
    for source in (gen_cfg.get("eos_token_id"), config.eos_token_ids, tokenizer.eos_token_id, turn_ends):
        for t in [source] if isinstance(source, int) else list(source or []):
            if t not in ids:
                ids.append(t)
    return ids


def _load_hf_dir(path: Path, name: str, dtype: str) -> LoadedModel:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise ModelNotFoundError(f"{path} has no config.json")
    from lantern.app.models.family_falcon_h1 import folded_by_mlx_lm
    from lantern.app.models.quant.modelopt import config_from_folder

    config = ModelConfig.from_hf(folded_by_mlx_lm(config_from_folder(json.loads(cfg_file.read_text()), path), path))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFoundError(f"{path} has no *.safetensors weights")
    gen_file = path / "generation_config.json"
    gen_cfg = json.loads(gen_file.read_text()) if gen_file.is_file() else {}
    tokenizer = _folder_tokenizer(path)
    spec = ModelSpec(name=name, config=config, weight_format="safetensors", weight_files=files, dtype=dtype)
    template = tokenizer.chat_template or _processor_chat_template(path)
    return LoadedModel(spec, tokenizer, _collect_eos(config, tokenizer, gen_cfg), template)


def _processor_chat_template(path: Path) -> str | None:
    """The template a vision-language folder may keep only for its processor (chat_template.json: Qwen2.5-VL,
    Qwen3-VL), which tokenizers do not read."""
    file = path / "chat_template.json"
    if not file.is_file():
        return None
    try:
        template = json.loads(file.read_text()).get("chat_template")
    except (ValueError, AttributeError):
        logger.warning("%s is not a JSON object with a chat_template; ignored", file)
        return None
    return template if isinstance(template, str) else None


def _load_gguf(path: Path, dtype: str) -> LoadedModel:
    """Hyper-parameters and tokenizer come from the file; transformers maps GGUF metadata to HF.

    A split model (`name-00001-of-00003.gguf`, whichever part is named) reads its metadata from
    the first part and its tensors from all of them.
    """
    from lantern.app.models.gguf_names import SPLIT_SUFFIX, gguf_split_parts, gguf_tensor_names

    try:
        parts = gguf_split_parts(path)
    except FileNotFoundError as exc:
        raise ModelNotFoundError(str(exc)) from None
    first = parts[0]
    hf_cfg, tokenizer = gguf_config_and_tokenizer(first)
    if len(parts) > 1:
        # transformers decides tying by looking for output.weight in the one file it reads.
        hf_cfg["tie_word_embeddings"] = "output.weight" not in gguf_tensor_names(first)
    try:
        config = ModelConfig.from_hf(hf_cfg)
    except UnsupportedModelError as exc:  # its keys are the config.json the metadata reads as
        raise UnsupportedModelError(f"{first.name} (GGUF metadata read as config.json): {exc}") from None
    name = SPLIT_SUFFIX.sub("", first.stem)
    spec = ModelSpec(name=name, config=config, weight_format="gguf", weight_files=parts, dtype=dtype)
    return LoadedModel(spec, tokenizer, _collect_eos(config, tokenizer, {}), tokenizer.chat_template)


def gguf_config_and_tokenizer(path: Path) -> tuple[dict[str, Any], Any]:
    """The HF config dict and fast tokenizer of a GGUF file.

    transformers rebuilds the tokenizer from GGUF metadata in Python (about 6 s for SmolLM2's 49k
    tokens, several times that on a busy CPU) and parses the metadata again for the config, so the
    result is saved once under <cache>/tokenizers/<key> and read back next time in ~0.1 s.
    """
    folder = gguf_cache_folder(path)
    cfg_file = folder / "gguf_config.json"
    if cfg_file.is_file():
        try:
            hf_cfg = json.loads(cfg_file.read_text())
            tokenizer = _load_saved_tokenizer(folder)
            logger.info("GGUF tokenizer and config from the cache %s", folder)
            return hf_cfg, tokenizer
        except Exception as exc:
            logger.warning("rebuilding the unreadable tokenizer cache %s: %s", folder, exc)
            _discard(folder)
    hf_cfg, tokenizer = _convert_gguf(path)
    _save_atomically(folder, hf_cfg, tokenizer)
    return hf_cfg, tokenizer


def _folder_tokenizer(path: Path) -> Any:
    """A folder's tokenizer through AutoTokenizer, never running the folder's own code (trust_remote_code=False:
    no import, and no prompt on the console, which would stall a server). Where AutoTokenizer fails -- it reads
    config.json first, which transformers cannot parse for some remote-code architectures Lantern serves
    (Nemotron-NAS's), or the tokenizer class is the folder's own code (InternLM2's, Baichuan's, ...) --: a
    tokenizer.json is the tokenizers library's own file of it; RWKV's World vocabulary is read by rwkv_tokenizer; a
    SentencePiece tokenizer.model is read as Llama's tokenizer (the class those modify), with a warning; else one line
    naming the class."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except (AttributeError, KeyError, OSError, TypeError, ValueError) as exc:
        failure = exc
    tok_file = path / "tokenizer_config.json"
    tok_cfg = json.loads(tok_file.read_text()) if tok_file.is_file() else {}
    tokenizer_class = tok_cfg.get("tokenizer_class")
    from lantern.app.models.rwkv_tokenizer import VOCAB_FILE

    if tokenizer_class == "RwkvTokenizer" and (path / VOCAB_FILE).is_file():  # (RWKV's World vocabulary)
        from lantern.app.models.rwkv_tokenizer import RwkvWorldTokenizer

        return RwkvWorldTokenizer.from_pretrained(str(path))
    if (path / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        logger.debug("AutoTokenizer could not load %s (%s): its tokenizer.json instead", path, failure)
        return PreTrainedTokenizerFast.from_pretrained(str(path))
    if (path / "tokenizer.model").is_file():
        from transformers import LlamaTokenizerFast

        logger.warning(
            "%s: tokenizer_class %s is the folder's own code, which Lantern does not run; its SentencePiece "
            "tokenizer.model is read as Llama's tokenizer, the class such tokenizers modify (text that starts with a "
            "space or follows a special token may come out in other tokens than the folder's own class gives)",
            path.name,
            tokenizer_class,
        )
        return LlamaTokenizerFast.from_pretrained(str(path))
    if "auto_map" not in tok_cfg:  # (no remote code involved: the folder lacks its tokenizer, or it is unreadable)
        raise UnsupportedModelError(f"{path.name}: its tokenizer could not be loaded ({failure})")
    raise UnsupportedModelError(
        f"{path.name}: its tokenizer (tokenizer_class {tokenizer_class!r}) could not be loaded without running the "
        f"folder's own code, and it has neither tokenizer.json nor tokenizer.model ({failure})"
    )


def _load_saved_tokenizer(folder: Path) -> Any:
    """The generic fast tokenizer class loads directly (skipping AutoTokenizer's ~1 s of imports
    and lookups); a model-specific class goes through AutoTokenizer as it was saved."""
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    if tok_cfg.get("tokenizer_class") == "RwkvWorldTokenizer":  # (an RWKV GGUF's: rwkv_tokenizer)
        from lantern.app.models.rwkv_tokenizer import RwkvWorldTokenizer

        return RwkvWorldTokenizer.from_pretrained(str(folder))
    if tok_cfg.get("tokenizer_class") in ("TokenizersBackend", "PreTrainedTokenizerFast"):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(folder))
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder))


def _convert_gguf(path: Path) -> tuple[dict[str, Any], Any]:
    """Config and tokenizer of a GGUF file (of every part of a split one for the tensor directory).

    The families gguf_config reads itself (gemma2, gemma3, phi3, glm4, deepseek2, gpt-oss) get their config
    from it; the rest from transformers' reader plus the keys it leaves out. The tokenizer comes
    from the tokenizer.ggml.* keys: AutoTokenizer reads the config first and refuses architectures
    transformers has no GGUF config for (glm4, deepseek2), so those files build it directly.
    """
    from transformers import AutoConfig, AutoTokenizer, PreTrainedTokenizerFast

    from lantern.app.models.gguf_config import hf_config_from_gguf, missing_config_keys
    from lantern.app.models.gguf_encoder import ENCODER_ARCHITECTURES, encoder_tokenizer
    from lantern.app.models.gguf_names import gguf_split_parts, read_gguf_index
    from lantern.app.models.gguf_pretokenize import apply_llama_cpp_split

    logger.info("reading GGUF metadata and tokenizer from %s (converted once, then cached)", path)
    indexes = [read_gguf_index(str(part)) for part in gguf_split_parts(path)]
    tensors = {t.name: t for index in indexes for t in index.tensors}
    hf_cfg = hf_config_from_gguf(indexes[0].metadata, tensors, path.name)
    if hf_cfg is not None and indexes[0].architecture in ENCODER_ARCHITECTURES:  # transformers builds none
        return hf_cfg, encoder_tokenizer(path)
    if hf_cfg is not None and indexes[0].metadata.get("tokenizer.ggml.model") == "rwkv":  # (RWKV's World vocabulary)
        from lantern.app.models.rwkv_tokenizer import gguf_tokenizer

        return hf_cfg, gguf_tokenizer(path, indexes[0].metadata)
    if hf_cfg is not None:
        if indexes[0].architecture == "gemma-embedding":
            _gemma_sentencepiece_for("gemma-embedding")
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(path.parent), gguf_file=path.name)
    else:
        hf_cfg = AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name).to_dict()
        hf_cfg.update(missing_config_keys(indexes[0].metadata, path.name, tensors=tensors))
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    apply_llama_cpp_split(tokenizer, indexes[0].metadata)  # the pre-tokenizers transformers splits as GPT-2
    return hf_cfg, tokenizer


def _gemma_sentencepiece_for(arch: str) -> None:
    """transformers applies its Gemma sentencepiece fixes (space runs respelled, merges in the vocabulary's order)
    by architecture name; EmbeddingGemma's GGUF names itself `gemma-embedding`: give that name Gemma 3's builder."""
    try:
        from transformers.integrations.gguf import gguf_tokenizer_mapping as mapping
    except ImportError:  # an older transformers: its own table, which a gemma-embedding file does not reach
        return
    builders = getattr(mapping, "GGUF_SENTENCEPIECE_BUILDERS", None)
    if isinstance(builders, dict) and "gemma3" in builders:
        builders.setdefault(arch, builders["gemma3"])


def gguf_cache_folder(path: Path) -> Path:
    """Cache folder for one GGUF file's converted tokenizer and config.

    The key covers the file (size, mtime, the first MiB: the header and the start of the
    metadata) and the transformers version that did the conversion, so a changed file or an
    upgraded converter gets a fresh entry.
    """
    import hashlib

    import transformers

    from lantern.app.models.default_model import cache_dir

    st = path.stat()
    digest = hashlib.sha256()
    digest.update(f"{_CACHE_FORMAT}|{transformers.__version__}|{st.st_size}|{st.st_mtime_ns}|".encode())
    with open(path, "rb") as f:
        digest.update(f.read(1 << 20))
    return cache_dir() / "tokenizers" / f"{path.stem}-{digest.hexdigest()[:16]}"


def _discard(folder: Path) -> None:
    """Move a damaged entry aside, then delete it, so the rebuilt one can take its name."""
    import shutil
    import tempfile

    try:
        trash = Path(tempfile.mkdtemp(prefix=f".{folder.name}.damaged.", dir=folder.parent))
        os.rename(folder, trash / "entry")
    except OSError as exc:
        logger.warning("cannot remove the damaged cache entry %s: %s", folder, exc)
        return
    shutil.rmtree(trash, ignore_errors=True)


def _save_atomically(folder: Path, hf_cfg: dict[str, Any], tokenizer: Any) -> None:
    """Write into a temporary sibling, then rename: a reader never sees half a cache entry, and
    two processes converting at once both succeed (the second rename loses harmlessly)."""
    import shutil
    import tempfile

    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    except OSError as exc:  # read-only cache: serve anyway, just slower next time
        logger.warning("cannot cache the GGUF tokenizer under %s: %s", folder.parent, exc)
        return
    try:
        tokenizer.save_pretrained(str(tmp))
        # gguf_config.json last: its presence marks a complete entry (not config.json, which
        # AutoTokenizer would read to pick a tokenizer class).
        (tmp / "gguf_config.json").write_text(json.dumps(hf_cfg, default=str))
        os.rename(tmp, folder)
    except OSError as exc:
        if not (folder / "gguf_config.json").is_file():
            logger.warning("cannot cache the GGUF tokenizer at %s: %s", folder, exc)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
