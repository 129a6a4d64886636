"""The design card's import arrows (DESIGN.md "Layout"), checked on the source: every import
statement of a package, static or inside a function, parsed with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {
    "colibri.engine": ROOT / "colibri" / "engine",
    "colibri.text": ROOT / "colibri" / "text",
    "colibri.reference": ROOT / "reference",
    "colibri.accelerated": ROOT / "accelerated",
    "colibri.server": ROOT / "server",
    "colibri.conformance": ROOT / "conformance",
}
BACKENDS = ("colibri.reference", "colibri.accelerated")
ENGINE_ALL = ("colibri.engine", *BACKENDS)
#: package -> the colibri packages it must not import. The engine may name a backend's module
#: only as data (registry strings), never in an import statement.
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "colibri.server": ENGINE_ALL,
    "colibri.conformance": (*ENGINE_ALL, "colibri.server"),
    "colibri.engine": (*BACKENDS, "colibri.server", "colibri.conformance"),
    "colibri.reference": ("colibri.accelerated", "colibri.server", "colibri.conformance"),
    "colibri.text": (*ENGINE_ALL, "colibri.server", "colibri.conformance"),
}
#: What a backend may take from the engine: the seam and the registry's options.
BACKEND_MAY_IMPORT = ("colibri.engine.backend", "colibri.engine.registry")


def imports(folder: Path) -> list[tuple[Path, int, str]]:
    found = []
    for path in sorted(folder.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found += [(path, node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.append((path, node.lineno, node.module))
                # `from colibri import reference` names a package too
                found += [(path, node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_no_forbidden_import_arrow(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path, line, name in imports(PACKAGES[package])
        if any(within(name, target) for target in FORBIDDEN[package])
    ]
    assert bad == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_backends_take_only_the_seam_from_the_engine(backend: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path, line, name in imports(PACKAGES[backend])
        if within(name, "colibri.engine")
        and not any(within(name, allowed) for allowed in BACKEND_MAY_IMPORT)
        and name != "colibri.engine"
    ]
    assert bad == []


def test_the_checker_sees_a_forbidden_arrow(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("def f():\n    from colibri.reference import model\n")
    assert [name for _, _, name in imports(tmp_path)] == [
        "colibri.reference", "colibri.reference.model"
    ]
