"""A session's private copy of the model with its routed experts in a shard of their own.

Under ``RAM_GB`` an engine reads routed experts from the model's files while it runs
(protocol.md §2.4, ``EXPERT_READ``). To check what it does when such a read fails, a case
damages the file the experts live in under the running engine and mends it again; doing that
to the model the target was given would break every other session, and to a shard that also
holds dense weights would break more than expert reads. So the session gets a copy: the
dense tensors in ``model-00001-of-00002.safetensors``, the routed experts
(``model.layers.L.mlp.experts.e.*``, spec/model.md) in ``model-00002-of-00002.safetensors``,
a ``model.safetensors.index.json`` naming both, and links to every other file of the model.

The copy moves tensor bytes as they are (any dtype, the file's ``__metadata__`` kept) and
reads nothing but safetensors headers, so the suite stays independent of the engine it
judges. Damage truncates the experts' shard to its header and mend writes the bytes back,
both in place: the engine keeps the file open, and a new file under the same name would be
a different file to it.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, BinaryIO

DENSE_SHARD = "model-00001-of-00002.safetensors"
EXPERT_SHARD = "model-00002-of-00002.safetensors"
INDEX = "model.safetensors.index.json"
#: What names a routed expert's tensor (spec/model.md: model.layers.L.mlp.experts.e.*);
#: ``mlp.shared_experts`` is dense.
ROUTED = ".mlp.experts."
#: Element sizes of the safetensors dtypes: tensors are laid out widest first, so each starts
#: at a multiple of its element size, as the format's writers do (it allows no padding).
ITEM_SIZE = {
    "BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1,
    "U16": 2, "I16": 2, "F16": 2, "BF16": 2,
    "U32": 4, "I32": 4, "F32": 4,
    "U64": 8, "I64": 8, "F64": 8,
}
_CHUNK = 1 << 24


class ModelCopyError(ValueError):
    """The model cannot be split (no safetensors, no routed experts, an unreadable header)."""


def _header(path: Path) -> tuple[dict[str, Any], int]:
    """A shard's header and where its data starts."""
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ModelCopyError(f"{path}: too short to be a safetensors file")
        size = int.from_bytes(head, "little")
        try:
            header = json.loads(fh.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ModelCopyError(f"{path}: header is not JSON ({exc})") from exc
    if not isinstance(header, dict):
        raise ModelCopyError(f"{path}: header is not an object")
    return header, 8 + size


def _shards(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX
    if index.is_file():
        weight_map = json.loads(index.read_text(encoding="utf-8")).get("weight_map", {})
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    return sorted(model_dir.glob("*.safetensors"))


def _copy_range(source: BinaryIO, begin: int, length: int, dest: BinaryIO) -> None:
    source.seek(begin)
    while length > 0:
        chunk = source.read(min(length, _CHUNK))
        if not chunk:
            raise ModelCopyError(f"{source.name}: ends inside a tensor")
        dest.write(chunk)
        length -= len(chunk)


def _write_shard(path: Path, tensors: list[tuple[str, dict[str, Any], Path, int]],
                 metadata: dict[str, str] | None) -> None:
    """Write the named tensors (name, header entry, source file, absolute data offset)."""
    def order(item: tuple[str, dict[str, Any], Path, int]) -> tuple[int, str]:
        dtype = item[1]["dtype"]
        if dtype not in ITEM_SIZE:
            raise ModelCopyError(f"tensor {item[0]}: unknown dtype {dtype!r}")
        return -ITEM_SIZE[dtype], item[0]

    placed = sorted(tensors, key=order)
    header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    offset = 0
    for name, entry, _, _ in placed:
        begin, end = entry["data_offsets"]
        header[name] = {**entry, "data_offsets": [offset, offset + end - begin]}
        offset += end - begin
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    sources: dict[Path, BinaryIO] = {}
    try:
        with path.open("wb") as out:
            out.write(len(encoded).to_bytes(8, "little") + encoded)
            for _name, entry, source, start in placed:
                begin, end = entry["data_offsets"]
                if source not in sources:
                    sources[source] = source.open("rb")
                _copy_range(sources[source], start + begin, end - begin, out)
    finally:
        for handle in sources.values():
            handle.close()


def split_experts(model_dir: Path, dest: Path) -> Path:
    """Write ``model_dir`` into ``dest`` with its routed experts in a shard of their own;
    returns that shard's path."""
    dest.mkdir(parents=True, exist_ok=True)
    dense: list[tuple[str, dict[str, Any], Path, int]] = []
    experts: list[tuple[str, dict[str, Any], Path, int]] = []
    metadata: dict[str, str] | None = None
    shards = _shards(model_dir)
    if not shards:
        raise ModelCopyError(f"{model_dir}: no .safetensors files")
    for shard in shards:
        header, data_start = _header(shard)
        metadata = metadata or header.get("__metadata__")
        for name, entry in header.items():
            if name != "__metadata__":
                (experts if ROUTED in name else dense).append((name, entry, shard, data_start))
    if not experts:
        raise ModelCopyError(f"{model_dir}: no routed expert tensors (names with '{ROUTED}')")
    _write_shard(dest / DENSE_SHARD, dense, metadata)
    _write_shard(dest / EXPERT_SHARD, experts, metadata)
    weight_map = {name: DENSE_SHARD for name, *_ in dense}
    weight_map.update({name: EXPERT_SHARD for name, *_ in experts})
    total = sum(e["data_offsets"][1] - e["data_offsets"][0] for _, e, *_ in dense + experts)
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (dest / INDEX).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    for item in model_dir.iterdir():
        if item.name.endswith(".safetensors") or item.name == INDEX:
            continue
        link = dest / item.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(item.resolve())
    return dest / EXPERT_SHARD


class ExpertShard:
    """The experts' shard of a session's model copy, damaged and mended in place."""

    def __init__(self, path: Path, backup: Path) -> None:
        self.path = path
        self.backup = backup
        _, self.data_start = _header(path)

    def truncate(self) -> None:
        """Cut the shard back to its header: every expert read now comes up short."""
        if not self.backup.exists():
            shutil.copyfile(self.path, self.backup)
        with self.path.open("r+b") as fh:
            fh.truncate(self.data_start)

    def restore(self) -> None:
        """Write the whole shard back into the same file."""
        if not self.backup.exists():
            return  # never damaged: already whole
        with self.backup.open("rb") as whole, self.path.open("r+b") as fh:
            shutil.copyfileobj(whole, fh, _CHUNK)
            fh.truncate()
