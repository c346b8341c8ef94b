"""Packaging: a non-editable install carries the files the front ends load at run time, and every
third-party module the front ends import is a runtime dependency (not only a dev one)."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
FRONT_ENDS = [ROOT / "tui", ROOT / "app" / "menubar"]
# Imports guarded like this are optional features (PyGObject for a GTK tray), not requirements.
_OPTIONAL_HANDLERS = {"ImportError", "ModuleNotFoundError"}


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    names = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(n, ast.Name) and n.id in _OPTIONAL_HANDLERS for n in names)


def required_imports(source: str) -> set[str]:
    """Top-level module names a source file imports, leaving out relative imports and imports
    inside a `try:` whose handlers catch ImportError (those are optional)."""
    tree = ast.parse(source)
    optional: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Try) and any(_catches_import_error(h) for h in node.handlers):
            optional.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in optional:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module.split(".")[0])
    return found


def _first_party(name: str) -> bool:
    return name == "lantern" or (ROOT / name / "__init__.py").exists() or (ROOT / f"{name}.py").exists()


def runtime_requirements(dependencies: list[str]) -> set[str]:
    """Normalized distribution names that an install without extras brings, on Linux and macOS
    alike (a front end must not depend on a dependency only one platform gets)."""
    names: set[str] = set()
    for line in dependencies:
        req = Requirement(line)
        platforms = ("linux", "darwin")
        if req.marker is None or all(req.marker.evaluate({"sys_platform": p, "extra": ""}) for p in platforms):
            names.add(_normalize(req.name))
    return names


def missing_runtime_dependencies(dependencies: list[str]) -> dict[str, list[str]]:
    """{module: [files importing it]} for third-party front-end imports that no runtime
    dependency provides."""
    provided = runtime_requirements(dependencies)
    dists = importlib.metadata.packages_distributions()
    missing: dict[str, list[str]] = {}
    for folder in FRONT_ENDS:
        for path in sorted(folder.rglob("*.py")):
            for module in sorted(required_imports(path.read_text())):
                if module in sys.stdlib_module_names or _first_party(module):
                    continue
                if not {_normalize(d) for d in dists.get(module, [])} & provided:
                    missing.setdefault(module, []).append(str(path.relative_to(ROOT)))
    return missing


def _pyproject_dependencies() -> list[str]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def test_front_end_imports_are_runtime_dependencies():
    deps = _pyproject_dependencies()
    assert missing_runtime_dependencies(deps) == {}
    # The check sees what the front ends really use: the dependencies before httpx, pystray and
    # Pillow became runtime ones (dev-only: `lantern chat --url` and `lantern menubar` crashed).
    old = [d for d in deps if Requirement(d).name.lower() not in {"httpx", "pystray", "pillow"}]
    missing = missing_runtime_dependencies(old)
    assert set(missing) == {"httpx", "pystray", "PIL"}
    assert "tui/client.py" in missing["httpx"] and "app/menubar/controller.py" in missing["httpx"]
    assert missing["PIL"] == ["app/menubar/tray.py"]


def test_import_scan_skips_optional_and_relative_imports():
    source = (
        "import os, httpx.x\nfrom . import sibling\nfrom textual.app import App\n"
        "try:\n    import gi\n    from gi.repository import Gtk\nexcept ImportError:\n    gi = None\n"
        "try:\n    import pystray\nexcept Exception:\n    raise\n"
        "def f():\n    from PIL import Image\n"
    )
    # pystray's guard is not an ImportError one: a failing import still fails the command.
    assert required_imports(source) == {"os", "httpx", "textual", "pystray", "PIL"}
    assert runtime_requirements(["httpx>=0.27", "pyobjc; sys_platform == 'darwin'", "pytest; extra == 'dev'"]) == {
        "httpx"
    }


def test_wheel_is_one_lantern_package_with_the_web_files_and_tui_styles(tmp_path):
    # A copy without build/: setuptools reuses build/lib, where stale files could hide a gap.
    src = tmp_path / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(".git", "build", "*.egg-info", "__pycache__", "tests"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
        ],
        check=True,
        timeout=300,
    )
    [wheel] = tmp_path.glob("lantern-*.whl")
    zf = zipfile.ZipFile(wheel)
    names = set(zf.namelist())
    top = {n.split("/", 1)[0] for n in names if not n.split("/", 1)[0].endswith((".dist-info", ".data"))}
    assert top == {"lantern"}  # no top-level app/, server/... to clash with a user's own packages
    web = {p.name for p in (ROOT / "assets" / "web").iterdir()}
    assert {f"lantern/assets/web/{n}" for n in web} <= names  # server/app.py looks for ../assets/web
    assert {
        "lantern/__init__.py",
        "lantern/server/app.py",
        "lantern/tui/chat.tcss",
        "lantern/app/cli.py",
        "lantern/backends/torch/kernels/triton_kernels.py",
    } <= names
    py_files = {
        str(p.relative_to(ROOT)) for d in ("app", "backends", "server", "tui") for p in (ROOT / d).rglob("*.py")
    }
    assert {f"lantern/{p}" for p in py_files} <= names  # every module of every folder is shipped
    entry = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    assert "lantern = lantern.app.cli:main" in zf.read(entry[0]).decode()
    # What pip installs without extras (the wheel's metadata, not our reading of pyproject)
    # covers the front ends' imports.
    [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
    requires = [
        line.split(":", 1)[1].strip()
        for line in zf.read(metadata).decode().splitlines()
        if line.startswith("Requires-Dist:")
    ]
    assert missing_runtime_dependencies(requires) == {}
