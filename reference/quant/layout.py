"""How a container's tensors are spread over files: our naming, or colibri's converters'.

Both layouts hold the same tensors with the same bytes; readers take every ``*.safetensors``
of a directory in name order, so either reads back the same (spec/model.md §14 "Container").

- ``hf``: ``model.safetensors``, or ``model-00001-of-0000N.safetensors`` when the size limit
  splits it (HF's shard naming), each with ``{"format": "pt"}`` metadata.
- ``colibri``: what colibri's ``convert_fp8_to_int4.py`` and fp8 repacker write. The main
  model in ``out-00000.safetensors``, ``out-00001...``; the DSA indexer in ``out-idx-NNNNN``
  and the MTP layer in ``out-mtp-NNNNN`` (colibri converts each in a pass of its own); no
  metadata beyond the ``colibri.fmt`` stamps, and every fp8 resident weight stamped as its
  repacker does (routed experts never are: colibri's expert loads do not read stamps).
"""

from __future__ import annotations

import re
from enum import Enum

LAYOUTS = ("hf", "colibri")

_INDEXER = re.compile(r"^model\.layers\.\d+\.self_attn\.indexer\.")
_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class Part(Enum):
    """Which pass of colibri's converter writes a tensor (and so which file prefix)."""

    MAIN = "out-"
    INDEXER = "out-idx-"
    MTP = "out-mtp-"


def is_indexer_tensor(name: str) -> bool:
    """A DSA indexer weight, of a decoder layer or of the MTP layer."""
    return _INDEXER.match(name) is not None


def part_of(name: str, num_hidden_layers: int) -> Part:
    """The indexer pass takes every indexer tensor, the MTP pass the rest of the MTP layer."""
    if is_indexer_tensor(name):
        return Part.INDEXER
    layer = _LAYER.match(name)
    if layer is not None and int(layer.group(1)) >= num_hidden_layers:
        return Part.MTP
    return Part.MAIN


def shard_names(layout: str, part: Part, count: int) -> list[str]:
    """File names of ``count`` shards of one part, in the order readers sort them."""
    if layout == "colibri":
        return [f"{part.value}{i:05d}.safetensors" for i in range(count)]
    if count == 1:
        return ["model.safetensors"]
    return [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]


def base_metadata(layout: str) -> dict[str, str]:
    """The ``__metadata__`` every shard carries before its stamps (colibri writes none)."""
    return {} if layout == "colibri" else {"format": "pt"}
