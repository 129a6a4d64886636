"""Whether a checkpoint carries the DSA indexer its config declares, and the config to run.

colibri's converter writes the indexer's tensors only when asked (a separate ``out-idx-*``
shard), and colibri's engine runs the indexer only when they are present; so a GLM-5
container made the default way declares ``indexer_types`` in its config.json yet holds no
indexer. Such a checkpoint runs with the indexer off: every query attends to every earlier
key (dense causal MLA, spec/model.md §6 "Indexer off"), and the KV records carry no indexer
keys. The config the engines run is the declared one with the indexer removed, so every
consumer (KV codec, persistence, plans) sees one consistent model.

An indexer present for some layers and absent for others, or a layer holding only part of
its indexer, is refused: that is a damaged container, not a convention (spec/DEVIATIONS.md).

Spec: spec/model.md §6.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass, replace
from typing import TextIO

from colibri.reference.config import ModelConfig
from colibri.reference.errors import CheckpointError
from colibri.reference.layout import indexer_group


@dataclass(frozen=True)
class IndexerPresence:
    """What a checkpoint holds of its config's DSA indexer.

    ``declared`` counts the decoder layers whose config says "full" (they score keys with an
    indexer of their own); ``stored`` how many of them hold every indexer tensor."""

    declared: int
    stored: int

    @property
    def active(self) -> bool:
        return self.declared > 0 and self.stored == self.declared

    @property
    def dropped(self) -> bool:
        """The config declares an indexer the checkpoint does not hold: it runs off."""
        return self.declared > 0 and self.stored == 0

    def describe(self) -> str:
        if self.declared == 0:
            return "none: config.json declares no indexer"
        if self.active:
            return f"on ({self.declared} indexer layer(s))"
        return ("off: config.json declares it but the checkpoint holds no indexer tensors "
                "(a colibri container written without its out-idx shard); attention is dense "
                "causal MLA over every earlier key")


def log_indexer(presence: IndexerPresence, log: TextIO) -> None:
    """The engine's start-up line about the indexer (none for a model that declares none)."""
    if presence.declared:
        print(f"== DSA indexer: {presence.describe()} ==", file=log)


def indexer_presence(config: ModelConfig, names: Container[str]) -> IndexerPresence:
    """Count the declared indexer layers that ``names`` holds in full; refuse a partial one."""
    if config.indexer_types is None:
        return IndexerPresence(0, 0)
    complete: list[int] = []
    absent: list[int] = []
    for layer, kind in enumerate(config.indexer_types):
        if kind != "full":
            continue
        tensors = [name for name, _ in indexer_group(config, f"model.layers.{layer}.").values()]
        missing = [name for name in tensors if name not in names]
        if not missing:
            complete.append(layer)
        elif len(missing) == len(tensors):
            absent.append(layer)
        else:
            raise CheckpointError(
                f"layer {layer}'s DSA indexer is incomplete: missing {', '.join(missing)}"
            )
    if complete and absent:
        first_missing = indexer_group(config, f"model.layers.{absent[0]}.")["wk"][0]
        raise CheckpointError(
            f"the DSA indexer is stored for layer(s) {_listed(complete)} but not for "
            f"{_listed(absent)}: missing {first_missing} (an incomplete out-idx shard?)"
        )
    return IndexerPresence(len(complete) + len(absent), len(complete))


def without_indexer(config: ModelConfig) -> ModelConfig:
    """``config`` as a model with no DSA indexer (what the engines run when none is stored)."""
    return replace(config, indexer_types=None, index_topk=0, index_n_heads=0, index_head_dim=0)


def resolve_indexer(config: ModelConfig, names: Container[str]
                    ) -> tuple[ModelConfig, IndexerPresence]:
    """The config the engines run for a checkpoint holding ``names`` (the declared one, or
    the declared one without its indexer when the checkpoint stores none), and what the
    checkpoint holds of the indexer (for the engine's start-up line)."""
    presence = indexer_presence(config, names)
    return (without_indexer(config) if presence.dropped else config), presence


def mtp_indexer_mode(config: ModelConfig, names: Container[str]) -> str | None:
    """The MTP layer's indexer mode: "full" when its indexer is stored and the decoder's
    runs (an MTP indexer beside a dropped decoder indexer stays off, as colibri's does)."""
    layer = config.num_hidden_layers
    wk = indexer_group(config, f"model.layers.{layer}.")["wk"][0] if config.indexer_types else ""
    return "full" if wk and wk in names else None


def _listed(layers: list[int]) -> str:
    return ", ".join(str(layer) for layer in layers)
