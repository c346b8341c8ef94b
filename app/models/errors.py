"""The error a model that Lantern cannot serve raises, and the one-line refusal of a config value."""

from __future__ import annotations

import json
from typing import Any


class UnsupportedModelError(ValueError):
    pass


def refuse(key: str, value: Any, why: str = "") -> UnsupportedModelError:
    return UnsupportedModelError(f"{key}={json.dumps(value)} in config.json is not implemented{why}")
