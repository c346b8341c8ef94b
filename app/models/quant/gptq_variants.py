"""GPTQ- and AWQ-packed checkpoints whose modules do not all share one mode.

- GPTQModel's `dynamic` (in a `gptq` quantization_config): regex -> per-module overrides, tried in
  order with `re.match` on the module's name, the first match deciding. A key "-:<regex>" keeps the
  matched modules in float (they are stored as plain `weight` tensors); "+:<regex>" or a bare regex
  gives them other `bits` / `group_size` (`sym` and `desc_act` need nothing here: zero points are
  read from the file, and `g_idx` says whether a module is act-order).
- Intel AutoRound (`quant_method: auto-round`): integer weights packed as AutoGPTQ packs them
  (`packing_format` "auto_round:auto_gptq", also written "auto_round:gptq": zeros stored minus one,
  as GPTQ v1) or as AutoAWQ's GEMM layout ("auto_round:auto_awq" / "auto_round:awq"), bits 2/3/4/8.
  `extra_config` maps module names (or, in newer exports, regexes tried with re.match after the exact
  names) to their own `bits` / `group_size` / `sym`, bits >= 16 meaning float. Without
  `packing_format`, AutoRound's own default (AutoGPTQ's) is taken, unless `backend` names one of its
  native layers, whose zero storage differs: refused. Modules outside `block_name_to_quantize` are
  stored in float and load as such.
  Other data types (`data_type` mx_fp, nv_fp, fp8...) and packings are refused naming the value;
  activation quantization (`act_bits` < 16) is not applied (activations stay float; logged once).
"""

from __future__ import annotations

import logging
import re
from typing import Any

logger = logging.getLogger(__name__)

GPTQ_BITS = (2, 3, 4, 8)
_GPTQ_PACKINGS = ("auto_round:auto_gptq", "auto_round:gptq")
_AWQ_PACKINGS = ("auto_round:auto_awq", "auto_round:awq")
_OVERRIDE_KEYS = {"bits", "group_size", "sym", "desc_act"}
_UNSET_KEYS = {"super_bits", "super_group_size"}  # AutoRound's GGUF double quantization: accepted when null
_REGEX_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")  # a module name is made of these; anything else is a regex


def _mode(
    key: str, entry: dict[str, Any], bits: int, group: int, allowed: tuple[int, ...], per_row: bool = True
) -> tuple[int, int] | None:
    """(bits, group_size) of a per-module entry over the defaults; None where it stays float (bits >= 16).
    Activation settings (`act_*`, AutoRound writes them per module) are not applied: activations stay
    float. per_row: whether group_size -1 (one group a row) is a layout of the packing (not AWQ's)."""
    from lantern.app.models.quant.hf_formats import _refuse

    if not isinstance(entry, dict):
        raise _refuse(key, entry, " (a dict of per-module settings)")
    unset = {k for k, v in entry.items() if k in _UNSET_KEYS and v is None}
    unknown = sorted(set(entry) - _OVERRIDE_KEYS - unset - {"data_type"} - {k for k in entry if k.startswith("act_")})
    if unknown:
        raise _refuse(f"{key}.{unknown[0]}", entry[unknown[0]], " (per-module bits, group_size, sym, desc_act)")
    bits, group = int(entry.get("bits", bits)), int(entry.get("group_size", group))
    if bits >= 16:  # (whatever data_type it names: float)
        return None
    if str(entry.get("data_type", "int")) != "int":
        raise _refuse(f"{key}.data_type", entry["data_type"], " (integer weights only)")
    if bits not in allowed:
        raise _refuse(f"{key}.bits", bits, f" (one of {allowed}, or 16 for float)")
    if group <= 0 and (group != -1 or not per_row):
        raise _refuse(f"{key}.group_size", group, " (-1 or a positive group)" if per_row else " (a positive group)")
    return bits, group


def dynamic_patterns(q: dict[str, Any], bits: int, group: int) -> tuple[tuple[str, tuple[int, int] | None], ...]:
    """GPTQModel's `dynamic` as (regex, mode or None for float), in the file's order."""
    from lantern.app.models.quant.hf_formats import _refuse

    dynamic = q.get("dynamic") or {}
    if not isinstance(dynamic, dict):
        raise _refuse("quantization_config.dynamic", dynamic, " (regex -> per-module settings)")
    out = []
    for raw, entry in dynamic.items():
        negative = raw.startswith("-:")
        pattern = raw[2:] if negative or raw.startswith("+:") else raw
        try:
            re.compile(pattern)
        except re.error as exc:
            raise _refuse(f"quantization_config.dynamic[{raw!r}]", entry, f" (not a regex: {exc})") from None
        key = f"quantization_config.dynamic[{raw!r}]"
        out.append((pattern, None if negative else _mode(key, entry or {}, bits, group, GPTQ_BITS)))
    return tuple(out)


def parse_autoround(q: dict[str, Any]) -> Any:
    """An AutoRound quantization_config as the GPTQ or AWQ scheme its packing is (module docstring)."""
    from lantern.app.models.quant.hf_formats import QuantScheme, _not_converted, _refuse

    backend = str(q.get("backend") or "")
    if not q.get("packing_format") and backend not in ("", "auto") and not any(p in backend for p in ("gptq", "awq")):
        # AutoRound's own older packing (its triton / exllamav2 layers) stores zero points as they are,
        # AutoGPTQ's minus one: without packing_format the file does not say which it holds
        raise _refuse("quantization_config.backend", backend, " for auto-round without packing_format")
    packing = str(q.get("packing_format") or "auto_round:auto_gptq").lower()
    if packing not in _GPTQ_PACKINGS + _AWQ_PACKINGS:
        raise _refuse("quantization_config.packing_format", packing, " for auto-round (auto_gptq or auto_awq packing)")
    data_type = str(q.get("data_type", "int"))
    if data_type != "int":
        raise _refuse("quantization_config.data_type", data_type, " for auto-round (integer weights only)")
    awq = packing in _AWQ_PACKINGS
    allowed = (4,) if awq else GPTQ_BITS
    bits, group = int(q.get("bits", 4)), int(q.get("group_size", 128))
    if bits not in allowed:
        raise _refuse("quantization_config.bits", bits, f" for auto-round with {packing} (one of {allowed})")
    if group <= 0 and (awq or group != -1):
        raise _refuse("quantization_config.group_size", group, " for auto-round")
    if int(q.get("act_bits", 16) or 16) < 16:
        logger.info("auto-round act_bits=%s: activations are not quantized (they stay float)", q["act_bits"])
    extra = q.get("extra_config") or {}
    if not isinstance(extra, dict):
        raise _refuse("quantization_config.extra_config", extra, " (module name -> settings)")
    overrides, patterns = {}, []
    for name, entry in extra.items():
        mode = _mode(f"quantization_config.extra_config[{name!r}]", entry, bits, group, allowed, per_row=not awq)
        if _REGEX_CHARS.search(str(name)):  # newer exports also write regexes here (their dynamic_config)
            patterns.append((str(name), mode))
        else:
            overrides[str(name)] = mode
    return QuantScheme(
        "awq" if awq else "gptq",
        bits,
        group,
        sym=bool(q.get("sym", True)),
        checkpoint_format="gemm" if awq else "gptq",
        overrides=overrides,
        patterns=tuple(patterns),
        modules_to_not_convert=_not_converted(q),
    )
