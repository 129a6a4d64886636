"""Installation health checks behind ``colibri doctor``.

Each check returns a :class:`Check` with status ``ok``, ``warn`` (works, but an optional
piece is missing) or ``fail`` (the installation is broken). The overall status is the worst
of them; the CLI exits non-zero only on ``fail``. The JSON shape follows colibri's own
doctor (``schema_version``, ``status``, ``checks[{id, status, summary}]``).
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.metadata
import json
import platform
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from colibri import control_plane, host_topology, resources
from colibri.engine.cuda_devices import Probe, probe_isolated

if TYPE_CHECKING:
    from colibri.reference.config import ModelConfig

Status = Literal["ok", "warn", "fail"]
_SEVERITY: dict[Status, int] = {"ok": 0, "warn": 1, "fail": 2}

SCHEMA_VERSION = 1
RUNTIME_MODULES: tuple[str, ...] = ("numpy", "ml_dtypes", "tornado", "jsonschema", "regex")


@dataclass(frozen=True)
class Check:
    id: str
    status: Status
    summary: str


def check_python() -> Check:
    version = platform.python_version()
    if sys.version_info < (3, 11):  # noqa: UP036 - doctor must say why an old Python fails
        return Check("python", "fail", f"Python {version}; colibri needs >= 3.11")
    return Check("python", "ok", f"Python {version} ({sys.executable})")


def _check_module(name: str) -> Check:
    try:
        importlib.import_module(name)
    except ImportError as exc:
        return Check(name, "fail", f"cannot import {name}: {exc}")
    try:
        dist_version = importlib.metadata.version(name.replace("_", "-"))
    except importlib.metadata.PackageNotFoundError:
        dist_version = "unknown version"
    return Check(name, "ok", f"{name} {dist_version}")


def check_runtime_modules() -> list[Check]:
    return [_check_module(name) for name in RUNTIME_MODULES]


def check_spec_data() -> Check:
    try:
        path = resources.spec_path("DEVIATIONS.md")
    except FileNotFoundError as exc:
        return Check("spec", "fail", str(exc))
    return Check("spec", "ok", f"spec data at {path.parent}")


def check_default_model() -> Check:
    try:
        model_dir = resources.default_model_dir()
    except FileNotFoundError as exc:
        return Check("default_model", "fail", str(exc))
    config = model_dir / "config.json"
    if not config.is_file():
        return Check("default_model", "fail", f"embedded default model missing: no {config}")
    return Check("default_model", "ok", f"embedded default model at {model_dir}")


def _compiler_version(cc: str) -> str:
    try:
        out = subprocess.run([cc, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return cc
    first = out.stdout.strip().splitlines()
    return f"{cc} ({first[0]})" if first else cc


def _default_threads() -> str:
    try:
        model = importlib.import_module("colibri.accelerated.model")
        return f"threads {model.default_threads()} (COLIBRI_THREADS, else the usable CPUs)"
    except (ImportError, ValueError) as exc:
        return f"threads: {exc}"


def check_host() -> Check:
    """The CPU and how its usable CPUs sit on cores and caches (always ``ok``: a fact for
    reading bandwidth figures, see :mod:`colibri.host_topology`)."""
    host = host_topology.describe()
    cpu = host["cpu"]
    name = cpu["name"] or platform.machine()
    if cpu["family"] is not None and cpu["model"] is not None:
        name += f" (family {cpu['family']} model {cpu['model']})"
    flags = " ".join(cpu["vector_flags"]) or "no vector flags reported"
    memory = f"; {host['memory_gb']} GB memory" if host["memory_gb"] is not None else ""
    return Check("host", "ok", f"{name}; {flags}; {host_topology.summary(host)}{memory}")


def check_accelerated() -> Check:
    """The accelerated engine's pieces: the C library (path, variant, the ISA it runs), the
    compiler that builds it, the kernel thread count, and the mypyc-compiled control plane.

    ``warn`` means the C library is not built (the accelerated engine is unavailable; the HTTP
    battery skips its accelerated run on it). A missing compiled control plane alone leaves
    ``ok``: ``--accelerated`` then runs the interpreted one, identically, and the summary says so.
    """
    try:
        native = importlib.import_module("colibri.accelerated.native")
        native_build = importlib.import_module("colibri.accelerated.native_build")
    except ImportError as exc:
        return Check("accelerated", "fail", f"cannot import colibri.accelerated: {exc}")
    parts: list[str] = []
    status: Status = "ok"
    try:
        path = native.library_path()
    except native.LibraryNotBuilt as exc:
        return Check("accelerated", "fail", str(exc))
    if path.is_file():
        try:
            lib = native.load_library()
            isa = lib.col_isa
            isa.restype = ctypes.c_char_p
            name = isa().decode()
        except (native.LibraryNotBuilt, AttributeError, OSError) as exc:
            return Check("accelerated", "fail", f"C kernels at {path} fail to load: {exc}")
        parts.append(f"C kernels: {path} (variant {native.chosen_variant()}, ISA {name})")
    else:
        status = "warn"
        parts.append(f"accelerated engine not built: no C kernels at {path} "
                     f"({control_plane.rebuild_hint()}); the reference engine is used")
    cc = native_build.compiler()
    parts.append(f"compiler {_compiler_version(cc)}" if cc else "no C compiler (set CC)")
    parts.append(_default_threads())
    try:
        build = control_plane.read_build()
        control_plane.check_current(build)
    except control_plane.ControlPlaneError as exc:
        parts.append(f"control plane interpreted: {exc}")
    else:
        names = sorted(n for n in build.files if n.startswith(("colibri.engine.", "colibri.text.")))
        parts.append(f"control plane compiled by mypyc {build.mypy_version}: {len(names)} modules "
                     f"in {build.directory} ({', '.join(n.split('.', 1)[1] for n in names)})")
    return Check("accelerated", status, "; ".join(parts))


#: Where `make build` puts the CUDA kernel library (only where nvcc exists).
CUDA_LIBRARY = Path("cuda") / "libcolibri_cuda.so"


def cuda_library_path() -> Path:
    from colibri.accelerated.native_build import DEFAULT_OUT

    return DEFAULT_OUT / CUDA_LIBRARY


def nvcc() -> tuple[str, str] | None:
    """(path, release) of the CUDA compiler: PATH, else the toolkit's default location."""
    import shutil

    path = shutil.which("nvcc") or next(
        (str(p) for p in (Path("/usr/local/cuda/bin/nvcc"),) if p.is_file()), None)
    if path is None:
        return None
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return path, f"unusable: {exc}"
    release = [line for line in out.stdout.splitlines() if "release" in line]
    return path, release[-1].split("release", 1)[1].strip() if release else "unknown release"


def check_cuda_build() -> Check:
    """The CUDA kernel library `make build` compiles where nvcc exists. Not built and no nvcc
    is a CPU-only installation (ok); nvcc present but nothing built means `make build` is due."""
    lib = cuda_library_path()
    compiler = nvcc()
    tool = f"nvcc {compiler[0]} ({compiler[1]})" if compiler else "no nvcc"
    if lib.is_file():
        return Check("cuda_build", "ok", f"CUDA kernels: {lib}; {tool}")
    if compiler is not None:
        return Check("cuda_build", "warn",
                     f"CUDA kernels not built: no {lib} ({control_plane.rebuild_hint()}); {tool}")
    return Check("cuda_build", "ok", f"CUDA kernels not built ({tool}: CPU-only build)")


def check_cuda_driver(found: Probe) -> Check:
    if found.driver_version is None:
        return Check("cuda_driver", "ok", f"no CUDA driver ({found.reason})")
    text = f"CUDA driver {found.driver_text} ({found.library})"
    if found.reason and not found.usable:
        text += f": {found.reason}"
    return Check("cuda_driver", "ok", text)


def check_gpu(found: Probe) -> Check:
    if not found.usable:
        return Check("gpu", "ok", f"no usable GPU ({found.reason}); CPU only")
    parts = []
    for d in found.devices:
        free = f"{d.free_bytes / 1e9:.1f} GB free" if d.free_bytes >= 0 else "free unknown"
        parts.append(f"{d.index}: {d.name}, {d.total_bytes / 1e9:.1f} GB total, {free}, "
                     f"sm_{d.compute_capability[0]}{d.compute_capability[1]}, "
                     f"{d.multiprocessors} SMs")
    status: Status = "ok"
    if found.missing:
        status = "warn"
        parts.append(f"COLI_GPUS/COLI_GPU asked for missing device(s) "
                     f"{', '.join(map(str, found.missing))}")
    return Check("gpu", status, f"{len(found.devices)} CUDA device(s): " + "; ".join(parts))


def check_cuda(found: Probe | None = None) -> list[Check]:
    """Build, driver, devices: the driver is probed in a child process with a deadline."""
    found = cuda_probe() if found is None else found
    return [check_cuda_build(), check_cuda_driver(found), check_gpu(found)]


def cuda_probe() -> Probe:
    return probe_isolated()


def cuda_report(found: Probe) -> dict[str, object]:
    """`doctor --json`'s ``cuda`` object: the build, the compiler and the probe's answer."""
    lib = cuda_library_path()
    compiler = nvcc()
    return {"kernels_library": str(lib), "kernels_built": lib.is_file(),
            "nvcc": None if compiler is None else {"path": compiler[0], "release": compiler[1]},
            **found.to_json()}


ALL_CHECKS: tuple[Callable[[], Check | list[Check]], ...] = (
    check_python,
    check_runtime_modules,
    check_spec_data,
    check_default_model,
    check_host,
    check_accelerated,
    check_cuda,
)


def run_checks(cuda: Probe | None = None) -> list[Check]:
    """Every check; ``cuda`` is a probe already made (the CLI reports it in JSON too)."""
    checks: list[Check] = []
    for check in ALL_CHECKS:
        result = check_cuda(cuda) if check is check_cuda else check()
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def overall_status(checks: list[Check]) -> Status:
    worst: Status = "ok"
    for check in checks:
        if _SEVERITY[check.status] > _SEVERITY[worst]:
            worst = check.status
    return worst


def report(checks: list[Check], model: Path | None = None,
           plan: dict[str, object] | None = None) -> dict[str, object]:
    out: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "status": overall_status(checks),
        "checks": [asdict(check) for check in checks],
    }
    if model is not None:
        out["model"] = str(model)
        out["plan"] = plan
    return out


def check_model(model: Path) -> list[Check]:
    """A model's config readable, its weights complete and their formats recognised."""
    from colibri.plan import PlanError, load_config
    from colibri.reference.safetensors import DTYPES

    try:
        config, model_dir = load_config(model)
    except PlanError as exc:
        return [Check("model_config", "fail", str(exc))]
    checks = [Check("model_config", "ok",
                    f"{config.model_type}: {config.num_hidden_layers} layers, "
                    f"{config.n_routed_experts} experts/layer, top-{config.num_experts_per_tok}")]
    if model_dir is None:
        return checks + [Check("model_weights", "warn", "config only: no weights to check")]
    index = model_dir / "model.safetensors.index.json"
    files = sorted(model_dir.glob("*.safetensors"))
    missing: list[str] = []
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            return checks + [Check("model_weights", "fail", f"{index} is unreadable: {exc}")]
        missing = sorted(s for s in shards if not (model_dir / s).is_file())
    if not files:
        return checks + [Check("model_weights", "fail", f"no *.safetensors in {model_dir}")]
    if missing:
        return checks + [Check("model_weights", "fail",
                               f"{len(missing)} shard(s) listed in {index.name} are missing: "
                               + ", ".join(missing[:5]))]
    dtypes: set[str] = set()
    names: set[str] = set()
    for path in files:
        try:
            with open(path, "rb") as handle:
                length = int.from_bytes(handle.read(8), "little")
                if length <= 0 or length > path.stat().st_size - 8:
                    raise ValueError("header length exceeds the file")
                header = json.loads(handle.read(length))
            end = max((int(v["data_offsets"][1]) for k, v in header.items()
                       if k != "__metadata__"), default=0)
            if 8 + length + end > path.stat().st_size:
                raise ValueError("tensor data runs past the end of the file (truncated?)")
        except (OSError, ValueError, KeyError, TypeError) as exc:
            return checks + [Check("model_weights", "fail", f"{path.name}: {exc}")]
        dtypes.update(str(v["dtype"]) for k, v in header.items() if k != "__metadata__")
        names.update(k for k in header if k != "__metadata__")
    checks.append(Check("model_weights", "ok", f"{len(files)} safetensors file(s) complete"))
    checks.append(check_model_indexer(config, names))
    unknown = sorted(dtypes - set(DTYPES))
    if unknown:
        checks.append(Check("model_formats", "fail", "unrecognised tensor dtypes: "
                            + ", ".join(unknown)))
    else:
        checks.append(Check("model_formats", "ok", "tensor dtypes " + ", ".join(sorted(dtypes))))
    checks.append(check_model_page_cache(files))
    return checks


def check_model_indexer(config: ModelConfig, names: set[str]) -> Check:
    """Whether the DSA indexer the config declares is stored: a colibri container written
    without its out-idx shard runs with it off (attention over every earlier key)."""
    from colibri.reference.errors import CheckpointError
    from colibri.reference.indexer_presence import indexer_presence

    try:
        presence = indexer_presence(config, names)
    except CheckpointError as exc:
        return Check("model_indexer", "fail", str(exc))
    return Check("model_indexer", "warn" if presence.dropped else "ok",
                 f"DSA indexer {presence.describe()}")


#: Fewer cached bytes than this are not worth a warning about their page size.
PAGE_CACHE_WARN_BYTES = 256 << 20


def check_model_page_cache(files: list[Path]) -> Check:
    """How the weight files sit in the page cache (nothing is read from disk): a checkpoint
    cached in 4 KiB folios, as one downloaded or copied in small pieces is, decodes 6-9 %
    slower than in 2 MiB folios (``colibri.benchmarks.page_cache``)."""
    from colibri.benchmarks.page_mapping import cached_mapping

    state = cached_mapping(files)
    if state is None:
        return Check("model_page_cache", "ok", "this platform does not say how files are cached")
    cached, fraction = state["cached_bytes"], state["huge_mapped_fraction"]
    summary = (f"{cached / 1e9:.2f} of {state['file_bytes'] / 1e9:.2f} GB of weights in the "
               f"page cache, {fraction:.0%} of it in 2 MiB pages")
    if cached >= PAGE_CACHE_WARN_BYTES and fraction < 0.5:
        folder = files[0].parent  # files is not empty: something is cached
        return Check("model_page_cache", "warn",
                     f"{summary}: in 4 KiB pages a decode streams its weights 6-9 % slower; "
                     f"`python -m colibri.benchmarks.page_cache {folder}` reads them back")
    return Check("model_page_cache", "ok", summary)


def plan_summary(model: Path) -> dict[str, object] | None:
    from colibri.plan import PlanError, Request, build

    try:
        plan = build(model, Request())
    except PlanError:
        return None
    ram, kv = plan["tiers"]["ram"], plan["kv"]
    return {"ram_budget_bytes": ram["budget_bytes"], "cache_slots_per_layer":
            ram["cache_slots_per_layer"], "hot_experts": plan["tiers"]["vram"]["hot_experts"],
            "kv_bytes_per_slot": kv["bytes_per_slot"], "kv_slots_that_fit": kv["slots_that_fit"],
            "projected_hit_rate": plan["projected_hit_rate"]}
