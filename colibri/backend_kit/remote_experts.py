"""Routed experts computed by expert workers: the engine's side of the per-layer call.

On a cluster the engine keeps attention, the router, dense layers and the head; the routed
experts live on workers (``expert_worker.py``), each owning a set of (layer, expert) pairs
(``Placement``). For each routed layer of a step the engine groups the rows by expert the way
both backends group them locally (``group_rows``: experts ascending, each expert's (row, slot)
pairs in row order), sends every owner that has work ONE call carrying the rows its experts
need, and places the outputs where the local computation would have put them. The weighted
sum stays with the engine, in its fixed slot order, so a row's result is the local bytes
whenever the workers compute with the engine's kernels on the same machine kind.

A call either returns every owner's outputs or raises ``RemoteExpertError`` (a worker lost,
an error inside a worker, or no answer within the deadline); nothing is written into the
caller's buffers before every owner has answered, so a partial layer result is never used.
``RemoteExpertError`` is a ``BackendReadError``: the engine ends the step's requests with
``ERROR <id> EXPERT_READ`` (a step could not get model data it needed), rolls the step back
and keeps serving.

The transport is behind ``ExpertCaller`` (``ray_cluster.py`` for Ray; tests call workers in
process), so this module does not import Ray.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt

from colibri.engine.backend import BackendReadError, ExpertNode

if TYPE_CHECKING:  # reference's package imports its backend, which imports this module
    from colibri.reference.config import ModelConfig
    from colibri.reference.safetensors import Checkpoint

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]
I64 = npt.NDArray[np.int64]

#: A layer call waits this long for every owner by default: a lost worker is usually reported
#: by Ray within seconds; a worker that is merely slow is treated as lost after this.
DEFAULT_DEADLINE_S = 10.0
#: Round trips kept for the latency report (median, p90).
ROUND_TRIPS_KEPT = 4096


#: An expert worker was lost, failed or missed its deadline. The engine's own class, not a
#: subclass: under the mypyc-compiled control plane ``BackendReadError`` is a native class,
#: which interpreted code may raise but not subclass.
RemoteExpertError = BackendReadError


@dataclass(frozen=True)
class ExpertCall:
    """One owner's work for one layer: expert ``experts[i]`` applied to
    ``x[rows[start[i]:start[i + 1]]]``; the answer is [start[-1], D] in that order."""

    layer: int
    experts: list[int]
    x: F32
    start: I64
    rows: I64


class ExpertCaller(Protocol):
    """Sends calls to owners and returns every answer, or raises ``RemoteExpertError``."""

    def call(self, calls: Sequence[tuple[int, ExpertCall]], deadline_s: float) -> list[F32]: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class ExpertGroups:
    """A layer's (row, slot) pairs grouped by expert, as ``col_group_rows`` and the
    reference's ``routed_experts`` group them: ``used`` the distinct experts ascending, pairs
    ``start[i]:start[i + 1]`` expert ``used[i]``'s, ``rows`` each grouped pair's row and
    ``pairs`` its flat (row * k + slot) index."""

    used: I64
    start: I64
    rows: I64
    pairs: I64


def group_rows(chosen: I32) -> ExpertGroups:
    k = chosen.shape[1]
    flat = chosen.reshape(-1)
    order = np.argsort(flat, kind="stable").astype(np.int64)  # (row, slot) order per expert
    used, counts = np.unique(flat, return_counts=True)
    start = np.zeros(used.shape[0] + 1, np.int64)
    np.cumsum(counts, out=start[1:])
    return ExpertGroups(used.astype(np.int64), start, order // k, order)


@dataclass(frozen=True)
class Placement:
    """Which owner holds each routed expert: ``owner[layer][expert]``, for the layers that
    have routed experts (the decoder's sparse layers and any MTP layer)."""

    owners: int
    owner: dict[int, tuple[int, ...]]

    @classmethod
    def striped(cls, layers: Sequence[int], n_experts: int, owners: int) -> Placement:
        """Expert e of every layer on owner ``e % owners``: every owner gets a share of each
        layer, so a layer's work spreads over all of them."""
        if owners < 1:
            raise ValueError("a placement needs at least one owner")
        return cls(owners, {layer: tuple(e % owners for e in range(n_experts))
                            for layer in layers})

    def owned(self, owner: int) -> list[tuple[int, int]]:
        """The (layer, expert) pairs ``owner`` holds, in order."""
        return [(layer, e) for layer, table in sorted(self.owner.items())
                for e, o in enumerate(table) if o == owner]


def expert_layers(checkpoint: Checkpoint, cfg: ModelConfig) -> list[int]:
    """The layers whose routed experts the checkpoint stores (sparse decoder layers and an MTP
    layer, when it has one)."""
    from colibri.reference.experts import expert_tensor_names

    return [layer for layer in range(cfg.num_hidden_layers + 1)
            if expert_tensor_names(layer, 0)[0] in checkpoint]


class RemoteExperts:
    """The routed experts of every layer, computed by the owners of a ``Placement``."""

    def __init__(self, caller: ExpertCaller, placement: Placement,
                 deadline_s: float = DEFAULT_DEADLINE_S,
                 resident_bytes: Sequence[int] = ()) -> None:
        self.caller = caller
        self.placement = placement
        self.deadline_s = deadline_s
        #: Bytes each owner reported holding once its share was loaded (0 where unknown).
        self.resident_bytes = list(resident_bytes) or [0] * placement.owners
        #: Wall seconds of each layer call (every owner answered), newest last.
        self.round_trips: deque[float] = deque(maxlen=ROUND_TRIPS_KEPT)

    def nodes(self) -> list[ExpertNode]:
        """Each owner's experts and resident bytes (the engine's NODES line)."""
        return [ExpertNode(tuple(self.placement.owned(o)), self.resident_bytes[o])
                for o in range(self.placement.owners)]

    def grouped(self, layer: int, x: F32, groups: ExpertGroups) -> F32:
        """The outputs of every grouped pair, [pairs, D] in the grouped order."""
        table = self.placement.owner.get(layer)
        if table is None:
            raise RemoteExpertError(f"layer {layer}: no expert worker holds its experts")
        by_owner: dict[int, list[int]] = {}
        for i, e in enumerate(groups.used.tolist()):
            by_owner.setdefault(table[e], []).append(i)
        calls: list[tuple[int, ExpertCall]] = []
        for owner, blocks in sorted(by_owner.items()):
            rows = np.concatenate([groups.rows[groups.start[i] : groups.start[i + 1]]
                                   for i in blocks])
            counts = [int(groups.start[i + 1] - groups.start[i]) for i in blocks]
            start = np.zeros(len(blocks) + 1, np.int64)
            np.cumsum(counts, out=start[1:])
            # Each row the owner needs goes once, however many of its experts the row chose.
            needed, local = np.unique(rows, return_inverse=True)
            calls.append((owner, ExpertCall(layer, [int(groups.used[i]) for i in blocks],
                                            np.ascontiguousarray(x[needed], np.float32), start,
                                            local.astype(np.int64))))
        started = time.perf_counter()
        answers = self.caller.call(calls, self.deadline_s)
        self.round_trips.append(time.perf_counter() - started)
        out = np.empty((int(groups.start[-1]), x.shape[1]), np.float32)
        for (owner, call), answer in zip(calls, answers, strict=True):
            blocks = by_owner[owner]
            if answer.shape != (int(call.start[-1]), x.shape[1]) or answer.dtype != np.float32:
                raise RemoteExpertError(f"expert worker {owner} answered layer {layer} with "
                                        f"{answer.dtype}{list(answer.shape)}")
            for j, i in enumerate(blocks):
                at = int(groups.start[i])
                out[at : at + int(call.start[j + 1] - call.start[j])] = answer[
                    call.start[j] : call.start[j + 1]]
        return out

    def routed_outputs(self, layer: int, x: F32, chosen: I32) -> F32:
        """Each row's chosen experts applied to it, [rows, k, D] in the slots of ``chosen``:
        what the reference's ``routed_experts`` computes locally."""
        t, k = chosen.shape
        groups = group_rows(chosen)
        outputs = np.empty((t * k, x.shape[1]), np.float32)
        outputs[groups.pairs] = self.grouped(layer, x, groups)
        return outputs.reshape(t, k, x.shape[1])

    def fill_blocks(self, layer: int, x: F32, chosen: I32, y: F32,
                    done: npt.NDArray[np.uint8]) -> None:
        """The routed blocks of a layer's grouped outputs ``y`` ([(k + 1) * m, D], laid out as
        ``col_layer_experts`` lays them: the routed pairs grouped by expert, then the shared
        expert's block) filled in and marked done; ``done`` untouched on an error."""
        groups = group_rows(chosen)
        pairs = int(groups.start[-1])
        y[:pairs] = self.grouped(layer, x, groups)
        done[groups.used] = 1

    def close(self) -> None:
        self.caller.close()
