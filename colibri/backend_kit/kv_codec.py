"""A ``KVState`` <-> COLIKV1 records (spec/protocol.md 4.3).

A record holds, for one position: every decoder layer's attention cache in its order (MLA:
latent [kv_lora] and rope key [qk_rope]; a standard-attention family such as OLMoE: key and
value), then the indexer key [index_head_dim] of each layer that keeps one (DSA "full"
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
        #: Each layer's attention arrays (everything but the indexer key), in its order.
        self._main = [[(name, width) for name, width in layer.widths.items()
                       if name != "index_key"] for layer in layers]
        self._indexed = [i for i, layer in enumerate(layers) if "index_key" in layer.widths]
        self._index_width = layers[self._indexed[0]].widths["index_key"] if self._indexed else 0
        self.indexer_layers = len(self._indexed)
        self.record_floats = sum(width for main in self._main for _, width in main) + (
            self.indexer_layers * self._index_width
        )

    def _columns(self, state: KVState, start: int, stop: int) -> list[npt.NDArray[np.float32]]:
        cols: list[npt.NDArray[np.float32]] = []
        for layer, main in zip(state.layers, self._main, strict=True):
            for name, _ in main:
                cols.append(layer[name][start:stop])
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
        for i, main in enumerate(self._main):
            widths.extend((name, i, width) for name, width in main)
        for i in self._indexed:
            widths.append(("index_key", i, self._index_width))
        for name, layer, width in widths:
            state.layers[layer].arrays[name][:n] = rows[:, offset : offset + width]
            offset += width
        state.tokens.extend(int(t) for t in tokens)
