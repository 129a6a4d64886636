"""Where does a target's forward pass first depart from the reference? (spec/model.md §16)

A *dump* is an ``.npz`` file of named arrays for one teacher-forced prompt: ``tokens``;
per decoder layer L ``hidden.L`` (float32 [T, D], the residual stream after the layer),
on sparse layers ``experts.L`` (int [T, K], ascending expert ids) and
``expert_weights.L`` (float32 [T, K], same order), on layers with a DSA indexer
``dsa_keys.L`` (int [T, min(index_topk, T)], attended key positions ascending, -1
padded); and ``logits`` (float32 [T, V]). The golden
dump also carries ``reduction_length``.

Quantities are compared in the order the forward computes them -- per layer ``dsa_keys``,
``experts``, ``expert_weights``, ``hidden``; then ``logits`` -- and the first that departs is
reported with its layer, its token position and the values. Ids (keys, experts) are kind
(a), exact. Floats are kind (b): within ``Tolerance(reduction_length, s).logit`` where ``s``
is the largest absolute golden value of that array (the §15 rule with the quantity's own
scale instead of the logits'). A quantity the target did not dump is listed as missing,
never silently passed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from colibri.conformance.sameness import Tolerance, logit_scale_of

#: Within a layer, the order the forward computes its quantities in.
LAYER_QUANTITIES = ("dsa_keys", "experts", "expert_weights", "hidden")
EXACT = frozenset({"dsa_keys", "experts"})
_LAYERED = re.compile(r"^(dsa_keys|experts|expert_weights|hidden)\.([0-9]+)$")


class DumpError(ValueError):
    """A dump is unreadable or is not of the golden's prompt."""


@dataclass(frozen=True)
class Departure:
    layer: int | None  # None: the final logits
    quantity: str
    position: int
    detail: str

    def __str__(self) -> str:
        where = "final logits" if self.layer is None else f"layer {self.layer} {self.quantity}"
        return f"{where}, token position {self.position}: {self.detail}"


@dataclass
class LayerDiff:
    compared: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    departures: list[Departure] = field(default_factory=list)

    @property
    def first(self) -> Departure | None:
        return self.departures[0] if self.departures else None

    def report(self) -> str:
        lines = [f"compared {len(self.compared)} quantities"]
        if self.missing:
            lines.append(f"not in the target's dump: {', '.join(self.missing)}")
        if self.first is None:
            lines.append("no departure: the target agrees with the golden at every layer")
        else:
            lines.append(f"first departure: {self.first}")
            lines += [f"  then: {d}" for d in self.departures[1:6]]
        return "\n".join(lines)


def load(path: Path) -> dict[str, np.ndarray]:
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise DumpError(f"{path}: not a readable .npz dump ({exc})") from exc


def _order(golden: dict[str, np.ndarray]) -> list[tuple[int | None, str]]:
    layers = sorted({int(m.group(2)) for n in golden if (m := _LAYERED.match(n))})
    keys: list[tuple[int | None, str]] = [
        (layer, q) for layer in layers for q in LAYER_QUANTITIES if f"{q}.{layer}" in golden
    ]
    return keys + ([(None, "logits")] if "logits" in golden else [])


def diff(golden: dict[str, np.ndarray], target: dict[str, np.ndarray]) -> LayerDiff:
    """Every departure of ``target`` from ``golden``, in forward order."""
    for name in ("tokens", "reduction_length"):
        if name not in golden:
            raise DumpError(f"the golden dump has no {name!r}")
    if "tokens" not in target or not np.array_equal(target["tokens"], golden["tokens"]):
        raise DumpError("the target's dump is not of the golden's prompt (tokens differ)")
    n = int(golden["reduction_length"])
    out = LayerDiff()
    for layer, quantity in _order(golden):
        name = quantity if layer is None else f"{quantity}.{layer}"
        if name not in target:
            out.missing.append(name)
            continue
        out.compared.append(name)
        found = _compare(quantity, target[name], golden[name], n)
        if found is not None:
            position, detail = found
            out.departures.append(Departure(layer, quantity, position, detail))
    return out


def _compare(
    quantity: str, actual: np.ndarray, expected: np.ndarray, n: int
) -> tuple[int, str] | None:
    """(the first departing token position, what differs) or None."""
    if actual.shape != expected.shape:
        return 0, f"shape {actual.shape}, expected {expected.shape}"
    if quantity in EXACT:
        rows = np.flatnonzero(np.any(actual != expected, axis=tuple(range(1, actual.ndim))))
        if rows.size == 0:
            return None
        row = int(rows[0])
        return row, f"{actual[row].tolist()}, expected {expected[row].tolist()} (exact)"
    tolerance = Tolerance(n, logit_scale_of(expected)).logit
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    bad = ~(np.abs(a - e) <= tolerance)
    bad |= np.isfinite(a) != np.isfinite(e)
    rows = np.flatnonzero(np.any(bad.reshape(bad.shape[0], -1), axis=1))
    if rows.size == 0:
        return None
    row = int(rows[0])
    worst = int(np.argmax(np.where(bad[row], np.abs(a[row] - e[row]), -1.0)))
    return row, (f"element {worst}: {a[row].flat[worst]!r}, expected {e[row].flat[worst]!r}, "
                 f"max |difference| {np.nanmax(np.abs(a[row] - e[row])):.3g} > tolerance "
                 f"{tolerance:.3g}")
