"""The three kinds of sameness (spec/model.md §15) and the tolerance of kind (b).

(a) *exact everywhere*: token ids, text bytes, routing choices, every non-numeric field;
(b) *numeric within a stated tolerance*: logits, logprobs, entropies of logits;
(c) *byte-exact within one engine on one machine*: batched vs alone, cold vs warm prefix,
    1 vs N threads.

Kind (b) exists because a float32 dot product's last bits depend on its summation order,
and the order is the BLAS kernel's (chosen per CPU) or the backend's, not ours. Its rule
is a function of the model, not one global number, so it stays honest on larger models:

    tau_logit   = SAFETY_FACTOR * u * sqrt(n) * max(1, s)
    tau_logprob = 2 * tau_logit

with ``u = 2**-24`` (float32 unit roundoff), ``n`` the longest reduction of the forward
pass (:func:`reduction_length`) and ``s`` the model's logit scale, the largest absolute
logit of its oracle (``max |oracle_logits|``). Reordering a sum of ``n`` float32 terms of
magnitude ``s`` moves it by about ``u * sqrt(n) * s`` (rounding errors behave like a random
walk; Higham, *Accuracy and Stability of Numerical Algorithms*, on summation); the factor
covers the depth of the network (every layer adds its own reordering error to the residual
stream) and was measured, not guessed: spec/model.md §15 gives the
numbers. A logprob is ``z_i - logsumexp(z)``; each term moves by at most ``tau_logit``,
hence the factor 2.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

#: float32 unit roundoff.
UNIT_ROUNDOFF = 2.0**-24
#: How many random-walk rounding errors the tolerance admits: 3x the worst measured (2.68, on
#: every fixture and OpenBLAS kernel exercised; spec/DEVIATIONS.md, "Sameness tolerances")
#: and small enough that every wrong constant of tests/reference/test_oracle_perturbations.py fails.
SAFETY_FACTOR = 8.0

# config.json keys whose value is the length of a dot product in the forward pass, and the
# products of keys that are (the attention output projection reads all heads' values).
_LENGTH_KEYS = (
    "hidden_size",
    "intermediate_size",
    "moe_intermediate_size",
    "q_lora_rank",
    "kv_lora_rank",
)
_PRODUCT_KEYS = (
    ("num_attention_heads", "v_head_dim"),
    ("index_n_heads", "index_head_dim"),
)


def reduction_length(config: Mapping[str, Any], positions: int = 0) -> int:
    """The longest dot product of one forward pass of a model with this ``config.json``.

    ``positions`` is the longest sequence compared: attention sums over positions, so a
    context longer than every weight dimension lengthens the longest reduction.
    """
    text = config.get("text_config")
    if isinstance(text, Mapping):
        config = text  # a multimodal wrapper (kimi_k25): text is its text model's forward
    lengths = [int(config[k]) for k in _LENGTH_KEYS if isinstance(config.get(k), int)]
    lengths += [
        int(config[a]) * int(config[b])
        for a, b in _PRODUCT_KEYS
        if isinstance(config.get(a), int) and isinstance(config.get(b), int)
    ]
    if not lengths:
        raise ValueError("config has none of the dimensions that set the reduction length")
    return max(max(lengths), positions)


@dataclass(frozen=True)
class Tolerance:
    """Kind-(b) tolerances of one model (spec/model.md §15)."""

    reduction_length: int
    logit_scale: float

    def __post_init__(self) -> None:
        if self.reduction_length < 1:
            raise ValueError(f"reduction_length must be positive, not {self.reduction_length}")
        if not math.isfinite(self.logit_scale) or self.logit_scale < 0:
            raise ValueError(f"logit_scale must be finite and >= 0, not {self.logit_scale}")

    @property
    def logit(self) -> float:
        """Largest admissible |difference| of one logit."""
        scale = max(1.0, self.logit_scale)
        return SAFETY_FACTOR * UNIT_ROUNDOFF * math.sqrt(self.reduction_length) * scale

    @property
    def logprob(self) -> float:
        """Largest admissible |difference| of one logprob: logit and logsumexp each move."""
        return 2.0 * self.logit

    @classmethod
    def for_model_dir(cls, model_dir: str | Path, positions: int = 0) -> Tolerance:
        """The tolerance of a fixture folder: ``config.json`` and ``oracle_logits.npy``."""
        folder = Path(model_dir)
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        oracle = folder / "oracle_logits.npy"
        if not oracle.is_file():
            raise FileNotFoundError(
                f"{oracle}: the logit scale of a model comes from its oracle logits"
            )
        return cls(reduction_length(config, positions), logit_scale_of(np.load(oracle)))


def logit_scale_of(logits: np.ndarray) -> float:
    """``s`` of the rule: the largest finite absolute logit (NaN/inf are not scale)."""
    values = np.abs(np.asarray(logits, dtype=np.float64))
    finite = values[np.isfinite(values)]
    return float(finite.max()) if finite.size else 0.0


def printed(tolerance: float, decimals: int) -> float:
    """The tolerance of values printed with ``decimals`` decimals (C ``%.Nf``).

    Two values within ``tolerance`` can round to neighbours one unit of the last printed
    place apart, so a printed comparison admits that unit on top (not rounding both sides,
    which still flips at a boundary).
    """
    if decimals < 0:
        raise ValueError(f"decimals must be >= 0, not {decimals}")
    return tolerance + 10.0**-decimals


def max_excess(actual: np.ndarray, expected: np.ndarray, tolerance: float) -> float:
    """By how much the largest |actual - expected| exceeds ``tolerance`` (<= 0: within).

    Shapes must agree; a NaN or infinity must sit at the same place with the same value.
    """
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"shapes differ: {a.shape} vs {e.shape}")
    special = ~np.isfinite(e) | ~np.isfinite(a)
    if np.any(special) and not np.array_equal(a[special], e[special], equal_nan=True):
        return math.inf
    finite = ~special
    if not np.any(finite):
        return -tolerance
    return float(np.max(np.abs(a[finite] - e[finite]))) - tolerance


def ranking_difference(
    actual: Sequence[tuple[int | str, float]],
    expected: Sequence[tuple[int | str, float]],
    tolerance: float,
) -> str | None:
    """Why two top-k tables (``(id, logprob)`` best first) differ, or None if they agree.

    An id is a token id or any other identity of a candidate (TOPK names its candidates by
    their bytes); both tables use the same kind.

    The tables agree when they have the same length, the i-th logprobs are within
    ``tolerance`` (sorting a perturbed list moves each order statistic by at most the
    perturbation), and the ids agree except among candidates that are *tied*: expected
    entries whose logprobs lie within ``2 * tolerance`` of a neighbour (both sides may move
    by ``tolerance``) form a group whose ids may come in any order. The last group may
    reach past the end of the table, so there an actual id missing from the expected table
    is admitted when its logprob is within ``2 * tolerance`` of the expected last entry.
    """
    if len(actual) != len(expected):
        return f"{len(actual)} entries, expected {len(expected)}"
    for i, ((_, a), (_, e)) in enumerate(zip(actual, expected, strict=True)):
        if not _within(a, e, tolerance):
            return f"entry {i}: logprob {a!r}, expected {e!r} (tolerance {tolerance:.3g})"
    start = 0
    while start < len(expected):
        end = start + 1
        while end < len(expected) and _tied(expected[end - 1][1], expected[end][1], tolerance):
            end += 1
        want = sorted(i for i, _ in expected[start:end])
        got = sorted(i for i, _ in actual[start:end])
        if got != want:
            if end < len(expected) or not _tied_at_boundary(
                actual[start:end], expected[start:end], expected[-1][1], tolerance
            ):
                return f"entries {start}..{end - 1}: ids {got}, expected {want} (tied group)"
        start = end
    return None


def _within(a: float, e: float, tolerance: float) -> bool:
    if math.isnan(e) or math.isinf(e):
        return a == e or (math.isnan(a) and math.isnan(e))
    return abs(a - e) <= tolerance


def _tied(a: float, b: float, tolerance: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= 2.0 * tolerance


def _tied_at_boundary(
    group: Sequence[tuple[int | str, float]],
    expected: Sequence[tuple[int | str, float]],
    last: float,
    tolerance: float,
) -> bool:
    """The last group's strangers, and the expected ids they pushed out of the table, are
    candidates tied with the table's last entry."""
    wanted = {i for i, _ in expected}
    ids = [i for i, _ in group]
    if len(set(ids)) != len(ids):
        return False
    strangers_tied = all(i in wanted or _tied(lp, last, tolerance) for i, lp in group)
    return strangers_tied and all(i in ids or _tied(lp, last, tolerance) for i, lp in expected)
