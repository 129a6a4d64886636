"""A ``KVState`` <-> COLIKV1 records (spec/protocol.md 4.3).

A record holds, for one position: every decoder layer's latent [kv_lora] and rope key
[qk_rope], then the indexer key [index_head_dim] of each layer that keeps one (DSA "full"
layers). The MTP layer's cache and the hidden states are not saved: after a resume the MTP
window restarts, which changes drafting only, never the output.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from colibri.backend_kit.kv_state import KVState


class KvRecordCodec:
    def __init__(self, template: KVState) -> None:
        layers = template.layers
        self._main = [(layer.widths["latent"], layer.widths["rope_key"]) for layer in layers]
        self._indexed = [i for i, layer in enumerate(layers) if "index_key" in layer.widths]
        self._index_width = layers[self._indexed[0]].widths["index_key"] if self._indexed else 0
        self.indexer_layers = len(self._indexed)
        self.record_floats = sum(a + b for a, b in self._main) + (
            self.indexer_layers * self._index_width
        )

    def _columns(self, state: KVState, start: int, stop: int) -> list[npt.NDArray[np.float32]]:
        cols: list[npt.NDArray[np.float32]] = []
        for layer in state.layers:
            cols.append(layer["latent"][start:stop])
            cols.append(layer["rope_key"][start:stop])
        for i in self._indexed:
            cols.append(state.layers[i]["index_key"][start:stop])
        return cols

    def export_rows(self, state: object, start: int, stop: int) -> npt.NDArray[np.float32]:
        assert isinstance(state, KVState)
        out: npt.NDArray[np.float32] = np.concatenate(
            self._columns(state, start, stop), axis=1
        ).astype(np.float32)
        return out

    def restore(self, state: object, tokens: Sequence[int], rows: npt.NDArray[np.float32]) -> None:
        assert isinstance(state, KVState)
        n = len(tokens)
        state.truncate(0)
        state.reserve(n)
        offset = 0
        widths: list[tuple[str, int, int]] = []
        for i, (lat, rope) in enumerate(self._main):
            widths.append(("latent", i, lat))
            widths.append(("rope_key", i, rope))
        for i in self._indexed:
            widths.append(("index_key", i, self._index_width))
        for name, layer, width in widths:
            state.layers[layer].arrays[name][:n] = rows[:, offset : offset + width]
            offset += width
        state.tokens.extend(int(t) for t in tokens)
