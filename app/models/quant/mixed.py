"""Mixed-precision folders: one model whose linear modules use different quantization schemes.

NVIDIA's NVFP4 releases are ModelOpt `quant_algo: MIXED_PRECISION` exports (routed experts NVFP4, attention
FP8 or MXFP8, everything unlisted in float), with a `quantized_layers` map from module name to its own
`quant_algo`; compressed-tensors writes `format: mixed-precision` with several `config_groups`, each
with its own `targets` (module names, `re:` patterns, or the class name `Linear`). Both become a
QuantScheme with method "mixed" whose `table` gives each module its own scheme of the single-scheme
readers; which tensors make a module is then decided by that module's scheme.

Lookup: an exact module name first (ModelOpt's names also under the other spelling of a multimodal
model's language-model prefix, as vLLM tries them), then the patterns in order (re.match; compressed-
tensors orders them as its library does), then the class-wide default; None: the module stays float.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from lantern.app.models.quant.hf_formats import MEMBERS, QuantScheme, module_members


@dataclass(frozen=True)
class SchemeTable:
    """Module name -> its QuantScheme (None: float)."""

    exact: dict[str, QuantScheme] = field(default_factory=dict)
    patterns: tuple[tuple[str, QuantScheme], ...] = ()  # re.match, in order, after the exact names
    default: QuantScheme | None = None  # every other linear (compressed-tensors' "Linear" target)

    def scheme_for(self, prefix: str) -> QuantScheme | None:
        for name in _spellings(prefix):
            if name in self.exact:
                return self.exact[name]
        for pattern, scheme in self.patterns:
            if re.match(pattern, prefix):
                return scheme
        return self.default

    def schemes(self) -> list[QuantScheme]:
        """Each distinct scheme once, in the order first given."""
        every = [
            *self.exact.values(),
            *(s for _, s in self.patterns),
            *([self.default] if self.default is not None else []),
        ]
        return list({id(s): s for s in every if s is not None}.values())  # (None: a module kept in float)


# A multimodal model's language model is `model.language_model.*` in newer checkpoints and
# `language_model.model.*` in older ones; a config may name its modules either way.
_SWAPPED = (("model.language_model.", "language_model.model."), ("language_model.model.", "model.language_model."))


def _spellings(prefix: str) -> list[str]:
    names = [prefix] + [new + prefix[len(old) :] for old, new in _SWAPPED if prefix.startswith(old)]
    return names + (["lm_head"] if prefix.endswith(".lm_head") else [])


def mixed_scheme(table: SchemeTable, producer: str) -> QuantScheme:
    """The "mixed" QuantScheme of `table`; its label names the producer and each distinct scheme."""
    labels = " + ".join(dict.fromkeys(s.label for s in table.schemes()))
    return QuantScheme("mixed", 0, 0, checkpoint_format=f"{producer} mixed precision ({labels})", table=table)


def module_names(scheme: QuantScheme, tensor_names: Iterable[str]) -> dict[str, list[str]]:
    """hf_formats.quantized_module_names for a mixed scheme: each module's members by its own scheme.

    A tensor that marks a quantized module in any of the schemes but belongs to a module the config
    keeps in float, or whose own scheme it does not fit, is an error naming both (a loader would
    otherwise hand the scale tensors to the model as unexpected weights)."""
    table: SchemeTable = scheme.table
    markers = {m for s in table.schemes() for m in MEMBERS[s.method][0]}
    names = list(tensor_names)
    present = set(names)
    out: dict[str, list[str]] = {}
    unclaimed: dict[str, str] = {}  # prefix -> a marker tensor its scheme did not claim
    for name in names:
        for marker in markers:
            if not name.endswith("." + marker):
                continue
            prefix = name[: -len(marker) - 1]
            sub = table.scheme_for(prefix)
            if sub is None:
                raise ValueError(f"{name} is stored quantized but {scheme.label} keeps {prefix} in float")
            if marker in MEMBERS[sub.method][0]:
                if prefix not in out:
                    out[prefix] = module_members(sub, prefix, present)
            else:
                unclaimed.setdefault(prefix, name)
    for prefix, name in unclaimed.items():
        if prefix not in out:
            sub = table.scheme_for(prefix)
            raise ValueError(f"{prefix} is {sub.label if sub else 'float'} in the config, but {name} is stored")
    return out


def module_scheme(scheme: QuantScheme, prefix: str) -> QuantScheme:
    """The scheme one quantized module of a mixed folder is read with."""
    sub = scheme.table.scheme_for(prefix)
    if sub is None:
        raise ValueError(f"{prefix} is quantized in the file but {scheme.label} keeps it in float")
    return sub
