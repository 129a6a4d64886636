"""What a layer's attention reads and writes of one sequence's cache (spec/model.md §10)."""

from __future__ import annotations

from typing import Protocol

from colibri.reference.tensors import F32


class LayerCache(Protocol):
    """One layer's cache of one sequence, by array name (MLA: "latent", "rope_key",
    "index_key"; MHA: "key", "value"): rows are positions (or MTP slots), written and read in
    place."""

    def __getitem__(self, name: str) -> F32: ...
