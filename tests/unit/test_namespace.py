"""Everything imports through the one `lantern` namespace."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OLD_IMPORT = re.compile(r"^\s*(from|import)\s+(app|backends|server|tui)(\.|\s|$)", re.M)


def test_no_module_imports_the_old_top_level_names():
    offenders = [
        str(p.relative_to(ROOT))
        for d in ("lantern", "app", "backends", "server", "tui", "tests", "scripts")
        for p in (ROOT / d).rglob("*.py")
        if OLD_IMPORT.search(p.read_text(encoding="utf-8"))
    ]
    assert offenders == []


def test_public_api_from_the_top_and_no_top_level_app_package(tmp_path):
    # Run from an unrelated folder holding its own app/ package, as every FastAPI project does.
    (tmp_path / "app").mkdir()
    (tmp_path / "app" / "__init__.py").write_text("MINE = True\n")
    code = (
        "import app, lantern; from lantern import LLM, SamplingParams, AsyncEngine;"
        "from lantern.server.app import create_app; from lantern.app.engine import LLMEngine;"
        "assert app.MINE and SamplingParams().n == 1; print(AsyncEngine.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "lantern.app.engine.async_engine"


def test_every_module_imports_first_without_a_cycle():
    """Each module imported first, in a fresh lantern namespace (a cycle only shows when the
    module that starts it is the first one imported)."""
    code = r"""
import importlib, pkgutil, sys
import lantern
names = ["lantern"]
for pkg in ("app", "backends", "server", "tui"):
    mod = importlib.import_module(f"lantern.{pkg}")
    names += [m.name for m in pkgutil.walk_packages(mod.__path__, f"lantern.{pkg}.")]
failed = []
for name in names:
    for k in [k for k in sys.modules if k == "lantern" or k.startswith("lantern.")]:
        del sys.modules[k]
    try:
        importlib.import_module(name)
    except ImportError as exc:
        failed.append(f"{name}: {exc}")
print(len(names))
print("\n".join(failed))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    count, *failed = out.stdout.strip().split("\n")
    assert int(count) > 40 and [f for f in failed if f] == []
