"""The design card's import arrows (DESIGN.md "Layout"), checked on the source: every import
statement of a package, static or inside a function, parsed with ast."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
KIT = "colibri.backend_kit"
PACKAGES = {
    "colibri.engine": ROOT / "colibri" / "engine",
    KIT: ROOT / "colibri" / "backend_kit",
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
    "colibri.server": (*ENGINE_ALL, KIT),
    "colibri.conformance": (*ENGINE_ALL, KIT, "colibri.server"),
    "colibri.engine": (*BACKENDS, KIT, "colibri.server", "colibri.conformance"),
    "colibri.reference": ("colibri.accelerated", "colibri.server", "colibri.conformance"),
    KIT: ("colibri.accelerated", "colibri.reference.backend", "colibri.server",
          "colibri.conformance"),
    "colibri.text": (*ENGINE_ALL, KIT, "colibri.server", "colibri.conformance"),
}
#: What a backend may take from the engine: the seam and the registry's options.
BACKEND_MAY_IMPORT = ("colibri.engine.backend", "colibri.engine.registry")
#: The one module of reference/ built on the engine and the kit: the numpy backend. Every other
#: module of reference/ is the math, the config and the formats, and imports neither.
REFERENCE_BACKEND = Path("backend.py")
#: What the kit may take from the engine: the Backend interface.
KIT_MAY_IMPORT_FROM_ENGINE = ("colibri.engine.backend",)
#: What the kit may take from reference/: pure data (config, tensor aliases, the expert
#: weights record and the decoded-expert LRU), the checkpoint reader and the weight loader.
#: Model math a kit module needs is passed in by the backend.
KIT_MAY_IMPORT_FROM_REFERENCE = (
    "colibri.reference.config",
    "colibri.reference.expert_lru",
    "colibri.reference.experts",
    "colibri.reference.safetensors",
    "colibri.reference.tensors",
    "colibri.reference.weights",
)
#: What accelerated/ may take from reference/: pure data and loaders (config, errors,
#: checkpoint and container readers, tensor layout, weight loaders, quant formats), never math.
ACCELERATED_MAY_IMPORT_FROM_REFERENCE = (
    "colibri.reference.config",
    "colibri.reference.errors",
    "colibri.reference.experts",
    "colibri.reference.indexer_presence",
    "colibri.reference.layout",
    "colibri.reference.quant.codec",
    "colibri.reference.quant.container",
    "colibri.reference.quant.expert_store",
    "colibri.reference.quant.formats",
    "colibri.reference.safetensors",
    "colibri.reference.weights",
)


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


def _outside(name: str, package: str, allowed: tuple[str, ...]) -> bool:
    """``name`` is in ``package`` but none of ``allowed`` (the bare package name of a
    ``from package import module`` is judged by the module it names)."""
    return (within(name, package) and name != package
            and not any(within(name, a) for a in allowed))


def reference_arrows(folder: Path) -> list[str]:
    """reference/'s imports of the engine or the kit, outside the numpy backend."""
    return [
        f"{path.relative_to(folder)}:{line} imports {name}"
        for path, line, name in imports(folder)
        if path.relative_to(folder) != REFERENCE_BACKEND
        and (within(name, "colibri.engine") or within(name, KIT))
    ]


def kit_arrows(folder: Path) -> list[str]:
    """The kit's imports of either backend: of reference/ beyond its pure data, of
    accelerated/ at all; and of the engine beyond the Backend interface."""
    return [
        f"{path.relative_to(folder)}:{line} imports {name}"
        for path, line, name in imports(folder)
        if within(name, "colibri.accelerated")
        or _outside(name, "colibri.reference", KIT_MAY_IMPORT_FROM_REFERENCE)
        or _outside(name, "colibri.engine", KIT_MAY_IMPORT_FROM_ENGINE)
    ]


def accelerated_reference_arrows(folder: Path) -> list[str]:
    """accelerated/'s imports of reference/ beyond the pure data and loaders."""
    return [
        f"{path.relative_to(folder)}:{line} imports {name}"
        for path, line, name in imports(folder)
        if _outside(name, "colibri.reference", ACCELERATED_MAY_IMPORT_FROM_REFERENCE)
    ]


#: The clocks a module could read: the phase clock is read around the math (the kit's step
#: wrapper and row driver), never inside it.
CLOCK_MODULES = ("time", "timeit")


def reference_clock_reads(folder: Path) -> list[str]:
    """reference/'s imports of a clock (``import time``, ``from time import perf_counter``)."""
    return [
        f"{path.relative_to(folder)}:{line} imports {name}"
        for path, line, name in imports(folder)
        if any(within(name, clock) for clock in CLOCK_MODULES)
    ]


def test_reference_reads_no_clock() -> None:
    assert reference_clock_reads(PACKAGES["colibri.reference"]) == []


def test_the_clock_rule_sees_a_planted_clock(tmp_path: Path) -> None:
    reference = _plant(tmp_path / "reference", {
        "moe.py": "import time\n",
        "layer.py": "def f():\n    from time import perf_counter\n",
        "mla.py": "import timeline\n",
    })
    assert reference_clock_reads(reference) == [
        "layer.py:2 imports time",
        "layer.py:2 imports time.perf_counter",
        "moe.py:1 imports time",
    ]


def test_reference_imports_neither_the_engine_nor_the_kit() -> None:
    assert reference_arrows(PACKAGES["colibri.reference"]) == []


def test_the_kit_imports_neither_backend() -> None:
    assert kit_arrows(PACKAGES[KIT]) == []


def test_accelerated_takes_only_pure_data_from_reference() -> None:
    assert accelerated_reference_arrows(PACKAGES["colibri.accelerated"]) == []


def _plant(folder: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    return folder


def test_the_backend_rules_see_planted_violations(tmp_path: Path) -> None:
    reference = _plant(tmp_path / "reference", {
        "layer.py": "from colibri.backend_kit.kv_state import KVLayer\n",
        "moe.py": "def f():\n    import colibri.engine.backend\n",
        "quant/backend.py": "from colibri.backend_kit import phase_clock\n",
        "backend.py": "from colibri.backend_kit.row_driver import RowModel\n"
                      "from colibri.engine.backend import Step\n",
    })
    assert reference_arrows(reference) == [
        "layer.py:1 imports colibri.backend_kit.kv_state",
        "layer.py:1 imports colibri.backend_kit.kv_state.KVLayer",
        "moe.py:2 imports colibri.engine.backend",
        "quant/backend.py:1 imports colibri.backend_kit",
        "quant/backend.py:1 imports colibri.backend_kit.phase_clock",
    ]
    kit = _plant(tmp_path / "kit", {
        "a.py": "from colibri.reference.config import ModelConfig\n"
                "from colibri.reference import rope\n"
                "from colibri.engine.backend import Step\n",
        "b.py": "import colibri.accelerated.model\n"
                "from colibri.reference.backend import ReferenceModel\n"
                "from colibri.engine.mux import run\n",
    })
    assert kit_arrows(kit) == [
        "a.py:2 imports colibri.reference.rope",
        "b.py:1 imports colibri.accelerated.model",
        "b.py:2 imports colibri.reference.backend",
        "b.py:2 imports colibri.reference.backend.ReferenceModel",
        "b.py:3 imports colibri.engine.mux",
        "b.py:3 imports colibri.engine.mux.run",
    ]
    accelerated = _plant(tmp_path / "accelerated", {
        "model.py": "from colibri.reference.quant.formats import Fmt\n"
                    "def f():\n    from colibri.reference.dsa import select\n",
    })
    assert accelerated_reference_arrows(accelerated) == [
        "model.py:3 imports colibri.reference.dsa",
        "model.py:3 imports colibri.reference.dsa.select",
    ]


def test_the_checker_sees_a_forbidden_arrow(tmp_path: Path) -> None:
    (tmp_path / "x.py").write_text("def f():\n    from colibri.reference import model\n")
    assert [name for _, _, name in imports(tmp_path)] == [
        "colibri.reference", "colibri.reference.model"
    ]
