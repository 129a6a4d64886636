"""Convert an HF checkpoint into a colibri container with quantized routed experts.

Input: a directory of ``*.safetensors`` in F32/BF16/F16, or HF's FP8 layout (``F8_E4M3``
weights with ``<name>_scale_inv`` F32 block multipliers); fused expert tensors
(``mlp.experts.gate_up_proj`` ``[E, 2M, D]``, ``mlp.experts.down_proj`` ``[E, D, M]``) are split
per expert. Output: safetensors files named by ``--layout`` (``quant/layout.py``: ours or
colibri's converters') where each quantized weight is a ``U8`` payload plus its ``.qs``
sidecar, the model's JSON files, and a ``colibri.fmt`` stamp for the tensors whose byte sizes
would otherwise resolve to another format (and, in colibri's layout, every fp8 resident).

Spec: spec/model.md §14 "Engine use and fixtures".
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from colibri.reference.quant.codec import quantize
from colibri.reference.quant.errors import QuantFormatError
from colibri.reference.quant.formats import E8_BLOCK, FORMAT_NAMES, Fmt
from colibri.reference.quant.fp8 import dequantize_fp8
from colibri.reference.quant.layout import (
    LAYOUTS,
    Part,
    base_metadata,
    is_indexer_tensor,
    part_of,
    shard_names,
)
from colibri.reference.quant.resolve import resolve_format
from colibri.reference.quant.safetensors_file import (
    FMT_STAMP_KEY,
    SafetensorsDir,
    write_safetensors,
)
from colibri.reference.safetensors import text_model_name
from colibri.reference.tensors import F32

#: ``--experts`` / ``--dense`` choices -> (format, group size).
SCHEMES: dict[str, tuple[Fmt, int]] = {
    "f32": (Fmt.F32, 0),
    "int8": (Fmt.INT8_ROW, 0),
    "int4": (Fmt.INT4_ROW, 0),
    "int4g64": (Fmt.INT4_GROUPED, 64),
    "int4g128": (Fmt.INT4_GROUPED, 128),
    "int3": (Fmt.INT3_G64, 0),
    "int2": (Fmt.INT2_ROW, 0),
    "e8": (Fmt.E8_IQ3, 0),
    "fp8": (Fmt.FP8_E4M3_B128, 0),
}
EXPERT_SCHEMES = tuple(k for k in SCHEMES if k != "f32")
#: ``--io`` choices: the embedding and the lm_head (colibri's ``--io-bits`` 8 gives int8-row).
IO_SCHEMES = ("f32", "int8")
#: The tensors ``--io`` applies to (an MTP head reads the main model's).
IO_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")

#: JSON and tokenizer files copied next to the weights.
COPIED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "tiktoken.model",  # Kimi's rank-BPE vocabulary
)
SCALE_INV_SUFFIX = "_scale_inv"
DEFAULT_SHARD_BYTES = 4 << 30

_SPLIT_EXPERT = re.compile(
    r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$"
)
_EXPERT = _SPLIT_EXPERT
_FUSED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up_proj|down_proj)$")
_NEVER_QUANTIZED = re.compile(
    r"(norm\.weight|norm\.bias|mlp\.gate\.weight|e_score_correction_bias|embed_tokens\.weight|"
    r"lm_head\.weight|\.bias)$"
)


class ConvertError(ValueError):
    """The input or output of a conversion is unusable (named in the message)."""


@dataclass
class ConvertReport:
    tensors: int = 0
    quantized: int = 0
    input_bytes: int = 0
    output_bytes: int = 0
    formats: dict[str, int] = field(default_factory=dict)
    stamped: list[str] = field(default_factory=list)
    shards: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "tensors": self.tensors,
            "quantized": self.quantized,
            "input_bytes": self.input_bytes,
            "output_bytes": self.output_bytes,
            "formats": dict(sorted(self.formats.items())),
            "stamped": self.stamped,
            "shards": self.shards,
        }


def is_routed_expert(name: str) -> bool:
    return _EXPERT.match(name) is not None


def is_dense_linear(name: str, shape: tuple[int, ...]) -> bool:
    """2-D weights that ``--dense`` applies to: attention, dense/shared MLP, indexer, MTP."""
    return len(shape) == 2 and name.endswith(".weight") and not _NEVER_QUANTIZED.search(name)


class _Source:
    """Logical HF tensors of the input directory as float32 (or raw fp8 for pass-through)."""

    def __init__(self, directory: Path) -> None:
        self.files = SafetensorsDir(directory)

    def names(self) -> Iterator[tuple[str, tuple[int, ...], int]]:
        """``(logical name, shape, source bytes)`` in sorted order, fused experts split."""
        out: list[tuple[str, tuple[int, ...], int]] = []
        for name, entry in self.files.tensors.items():
            if name.endswith(".qs"):
                raise ConvertError(
                    f"{self.files.directory}: {name} is a colibri scale sidecar; the input is "
                    "already a colibri container, convert from the HF checkpoint instead"
                )
            if name.endswith(SCALE_INV_SUFFIX):
                if name[: -len(SCALE_INV_SUFFIX)] not in self.files:
                    raise ConvertError(f"{name}: scale without its weight")
                continue
            fused = _FUSED.match(name)
            if fused and len(entry.shape) == 3:
                experts, rows, cols = entry.shape
                per = entry.nbytes // experts
                for e in range(experts):
                    if fused.group(2) == "gate_up_proj":
                        half = rows // 2
                        for proj in ("gate_proj", "up_proj"):
                            expert = f"{fused.group(1)}.{e}.{proj}.weight"
                            out.append((expert, (half, cols), per // 2))
                    else:
                        expert = f"{fused.group(1)}.{e}.down_proj.weight"
                        out.append((expert, (rows, cols), per))
                continue
            out.append((name, entry.shape, entry.nbytes))
        return iter(sorted(out))

    def fp8_parts(self, name: str) -> tuple[npt.NDArray[np.uint8], F32] | None:
        """The raw e4m3 bytes and f32 block scales of an HF FP8 weight, else None."""
        if name not in self.files or self.files.entry(name).dtype != "F8_E4M3":
            return None
        scale_name = name + SCALE_INV_SUFFIX
        if scale_name not in self.files:
            raise ConvertError(f"{name}: F8_E4M3 weight without {scale_name}")
        scale = self.files.entry(scale_name)
        if scale.dtype != "F32":
            raise QuantFormatError(
                name,
                f"{scale_name} is {scale.dtype}: fp8 block scales must be F32 "
                "(UE8M0 scales are refused for GLM)",
            )
        return np.asarray(self.files.raw(name)), self.files.float32(scale_name).reshape(-1)

    def float32(self, name: str, shape: tuple[int, ...]) -> F32:
        if name in self.files:
            fp8 = self.fp8_parts(name)
            if fp8 is not None:
                rows, cols = shape
                scales = _checked_scales(name, fp8[1], rows, cols)
                return dequantize_fp8(fp8[0], scales, rows, cols)
            return self.files.float32(name)
        match = _SPLIT_EXPERT.match(name)
        if match is None:
            raise ConvertError(f"{name}: not in the input")
        prefix, e, proj = match.group(1), int(match.group(2)), match.group(3)
        # Slice the stored (memory-mapped) array first: converting the whole fused tensor
        # once per expert would cost O(experts^2).
        if proj == "down":
            return self._fused_slice(f"{prefix}.down_proj", e, None)
        return self._fused_slice(f"{prefix}.gate_up_proj", e, proj == "gate")

    def _fused_slice(self, name: str, expert: int, first_half: bool | None) -> F32:
        entry = self.files.entry(name)
        if entry.dtype not in ("F32", "F16", "BF16"):
            raise ConvertError(f"{name}: fused experts must be F32/F16/BF16, got {entry.dtype}")
        block = self.files.array(name)[expert]
        if first_half is not None:
            half = block.shape[0] // 2
            block = block[:half] if first_half else block[half:]
        return np.asarray(block, dtype=np.float32).copy()


def _checked_scales(name: str, scales: F32, rows: int, cols: int) -> F32:
    expected = -(-rows // 128) * -(-cols // 128)
    if scales.size != expected:
        raise QuantFormatError(
            name, f"{name}{SCALE_INV_SUFFIX} has {scales.size} block scales; [{rows}, {cols}] "
            f"needs {expected}"
        )
    if not np.all(np.isfinite(scales)):
        raise QuantFormatError(name, f"{name}{SCALE_INV_SUFFIX} holds non-finite scales")
    return scales


def _encode(
    source: _Source, name: str, shape: tuple[int, ...], fmt: Fmt, group_size: int
) -> dict[str, npt.NDArray[Any]]:
    rows, cols = shape
    if fmt == Fmt.FP8_E4M3_B128:
        raw = source.fp8_parts(name)
        if raw is not None:  # HF FP8 in, fmt8 out: the bytes pass through untouched
            scales = _checked_scales(name, raw[1], rows, cols)
            return {name: raw[0].reshape(-1).copy(), name + ".qs": scales}
    weights = source.float32(name, shape)
    if fmt == Fmt.F32:
        return {name: np.ascontiguousarray(weights, dtype=np.float32)}
    payload, scales = quantize(fmt, weights, group_size=group_size or 64, name=name)
    return {name: payload, name + ".qs": scales}


def _stamp_needed(name: str, shape: tuple[int, ...], fmt: Fmt, out: dict[str, Any]) -> bool:
    """True when unstamped byte arithmetic would not read back ``fmt`` (or would refuse)."""
    rows, cols = shape
    nb, ns = out[name].nbytes, out[name + ".qs"].nbytes
    try:
        resolved = resolve_format(name, rows, cols, nb, ns)
    except QuantFormatError:
        resolved = None
    if resolved is not None and resolved.fmt == fmt:
        return False
    if fmt == Fmt.INT4_ROW and resolved is not None and resolved.fmt == Fmt.INT4_GROUPED:
        return False  # one group per row: the same numbers either way
    # Must be resolvable with the stamp, or the container would be unreadable.
    resolve_format(name, rows, cols, nb, ns, stamp=FORMAT_NAMES[fmt])
    return True


def convert(
    model_dir: str | Path,
    out_dir: str | Path,
    experts: str,
    dense: str = "f32",
    *,
    io: str = "f32",
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    layout: str = "hf",
    indexer: bool = True,
    progress: Callable[[int, int], None] | None = None,
) -> ConvertReport:
    """Write the container for ``model_dir`` to the (absent or empty) ``out_dir``.

    ``progress(nbytes, total_bytes)`` is called after each tensor with its input bytes and
    the total over all tensors (the CLI draws the bar; this module stays I/O-free).
    ``io`` is the format of the embedding and the lm_head (``IO_TENSORS``). ``layout`` names
    the files (``quant/layout.py``); ``indexer=False`` leaves the DSA indexer out, as
    colibri's converter does unless asked, and the engines then run with it off."""
    if experts not in EXPERT_SCHEMES:
        choices = ", ".join(EXPERT_SCHEMES)
        raise ConvertError(f"--experts must be one of {choices}, got {experts!r}")
    if dense not in SCHEMES:
        raise ConvertError(f"--dense must be one of {', '.join(SCHEMES)}, got {dense!r}")
    if io not in IO_SCHEMES:
        raise ConvertError(f"--io must be one of {', '.join(IO_SCHEMES)}, got {io!r}")
    if layout not in LAYOUTS:
        raise ConvertError(f"--layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    src_dir, dst = Path(model_dir), Path(out_dir)
    if not (src_dir / "config.json").is_file():
        raise ConvertError(f"{src_dir}: no config.json (not a model directory)")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise ConvertError(f"{dst}: output exists and is not empty; refusing to overwrite it")
    source = _Source(src_dir)
    names = list(source.names())
    wrapped = any(text_model_name(name) != name for name, _, _ in names)
    plan = [(name, shape, nbytes, *_target(name, shape, experts, dense, io, wrapped))
            for name, shape, nbytes in names
            if indexer or not is_indexer_tensor(name)]
    decoder_layers = _decoder_layers(src_dir) if layout == "colibri" else 0
    _preflight(plan)
    report = ConvertReport()
    total_bytes = sum(p[2] for p in plan)
    dst.mkdir(parents=True, exist_ok=True)
    parts: dict[Part, _Shards] = {}
    stamps: dict[str, str] = {}
    for source_name, shape, nbytes, fmt, gs in plan:
        # A wrapper's text model is written under its text-model names, the names the
        # engines and the container's format resolution read.
        name = text_model_name(source_name)
        if fmt == Fmt.F32:
            out = {name: _kept(source, source_name, shape)}
        else:
            encoded = _encode(source, source_name, shape, fmt, gs)
            out = {name + key[len(source_name):]: array for key, array in encoded.items()}
            report.quantized += 1
            if _stamp_needed(name, shape, fmt, out) or (
                layout == "colibri" and fmt == Fmt.FP8_E4M3_B128 and not is_routed_expert(name)
            ):
                stamps[name] = FORMAT_NAMES[fmt]
        label = FORMAT_NAMES[fmt] + (f"/g{gs}" if gs else "")
        report.formats[label] = report.formats.get(label, 0) + 1
        part = part_of(name, decoder_layers) if layout == "colibri" else Part.MAIN
        report.output_bytes += parts.setdefault(part, _Shards(shard_bytes)).add(out)
        report.tensors += 1
        report.input_bytes += nbytes
        if progress is not None:
            progress(nbytes, total_bytes)
    for part in Part:  # main, indexer, MTP: the order colibri's passes run in
        if part in parts:
            _write_shards(dst, layout, part, parts[part].shards, stamps, report)
    _copy_json(src_dir, dst)
    report.stamped = sorted(stamps)
    return report


class _Shards:
    """Tensors grouped into files of at most ``limit`` bytes (a larger tensor alone)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.shards: list[dict[str, npt.NDArray[Any]]] = [{}]
        self.size = 0

    def add(self, tensors: dict[str, npt.NDArray[Any]]) -> int:
        nbytes = sum(a.nbytes for a in tensors.values())
        if self.shards[-1] and self.size + nbytes > self.limit:
            self.shards.append({})
            self.size = 0
        self.shards[-1].update(tensors)
        self.size += nbytes
        return nbytes


def _decoder_layers(src: Path) -> int:
    """``num_hidden_layers`` of the source: colibri's layout puts later layers (MTP) apart."""
    config = json.loads((src / "config.json").read_text())
    layers = config.get("num_hidden_layers") if isinstance(config, dict) else None
    if not isinstance(layers, int) or layers <= 0:
        raise ConvertError(
            f"{src}/config.json: --layout colibri needs num_hidden_layers (to split off MTP)"
        )
    return layers


def _target(name: str, shape: tuple[int, ...], experts: str, dense: str,
            io: str, wrapped: bool) -> tuple[Fmt, int]:
    """A tensor's format. In a multimodal wrapper (``wrapped``: Kimi's text model under
    ``model.language_model.``) the text model's tensors are matched by their text-model names,
    as the engines read them; the wrapper's own tensors (a vision tower, a projector), which
    no engine here reads, stay unquantized."""
    text = text_model_name(name)
    if text in IO_TENSORS:
        return SCHEMES[io]
    if wrapped and text == name:
        return Fmt.F32, 0
    if is_routed_expert(text):
        return SCHEMES[experts]
    if is_dense_linear(text, shape):
        return SCHEMES[dense]
    return Fmt.F32, 0


def _preflight(plan: list[tuple[str, tuple[int, ...], int, Fmt, int]]) -> None:
    """Refuse before writing anything when a tensor cannot take its target format."""
    for name, shape, _, fmt, _ in plan:
        if fmt == Fmt.F32:
            continue
        if len(shape) != 2:
            raise ConvertError(f"{name}: only 2-D weights are quantized, shape {list(shape)}")
        if fmt == Fmt.E8_IQ3 and shape[1] % E8_BLOCK != 0:
            raise QuantFormatError(
                name,
                f"e8-iq3-lattice needs a width that is a multiple of {E8_BLOCK}, got {shape[1]}",
            )


def _kept(source: _Source, name: str, shape: tuple[int, ...]) -> npt.NDArray[Any]:
    """A tensor left unquantized: every float (BF16, F16, HF FP8) becomes F32, as colibri's
    converter keeps norms, the router and the correction bias; other dtypes are copied."""
    if source.fp8_parts(name) is not None:
        return source.float32(name, shape)
    if source.files.entry(name).dtype in ("F32", "F16", "BF16"):
        return source.files.float32(name)
    return np.array(source.files.array(name))


def _write_shards(
    dst: Path, layout: str, part: Part, shards: list[dict[str, Any]], stamps: dict[str, str],
    report: ConvertReport,
) -> None:
    for name, tensors in zip(shard_names(layout, part, len(shards)), shards, strict=True):
        local = {k: v for k, v in stamps.items() if k in tensors}
        meta = base_metadata(layout)
        if local:
            meta[FMT_STAMP_KEY] = json.dumps(local, sort_keys=True, separators=(",", ":"))
        write_safetensors(dst / name, tensors, meta, by_name=True)
        report.shards.append(name)


def _copy_json(src: Path, dst: Path) -> None:
    for name in COPIED_FILES:
        path = src / name
        if not path.is_file():
            continue
        if name == "config.json":
            config = json.loads(path.read_text())
            # The container is no longer an HF FP8 checkpoint; colibri formats are self-described.
            config.pop("quantization_config", None)
            (dst / name).write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(path, dst / name)
