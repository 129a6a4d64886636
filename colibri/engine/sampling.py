"""Token choice from a logit row, as colibri does it, and log-probability tables.

Every rule here is normative (spec/model.md, "Sampling and RNG"):

- ``temperature <= 0`` is greedy: the first maximum, NaN skipped (all NaN: id 0). No
  random number is drawn.
- Otherwise (``distribution``): ``p_i = expf((l_i - max) * (1 / max(t, 1e-4)))`` in
  float32 over the finite logits (non-finite ones get 0), the sum in float64 accumulated in
  id order, ``p_i /= (float)sum``; then, when ``0 < top_p < 1``, nucleus truncation: tokens
  in descending probability (ties: lower id first) are kept until their float64 running
  mass reaches ``top_p`` (at least one), the rest are zeroed and the kept ones divided by
  their own float32-rounded sum. ``temperature`` and ``top_p`` are float32 as on the wire.
- ``sample_index``: ``u = uniform() * (1 - p[ban])``; ids are scanned in ascending order,
  a float64 running sum of ``p`` is kept, and the first id whose sum is ``>= u`` wins;
  if rounding leaves none, the last id with ``p > 0``.
- Log-probabilities are a float64 log-softmax over the raw row (no temperature, no top-p):
  ``lp_i = l_i - (max + log(sum_j exp(l_j - max)))``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import numpy.typing as npt

from colibri.protocol.records import NO_PREDICTOR, Logprobs

FloatRow = npt.NDArray[np.float32]


class UniformSource(Protocol):
    """Anything that hands out colibri uniforms in [0, 1), e.g. :class:`rng.Rng`."""

    def uniform(self) -> float: ...


#: The widest top-k table the wire protocol carries (``logprobs=0..32``).
MAX_TOP_LOGPROBS = 32

_MIN_TEMPERATURE = np.float32(1e-4)
_TOPK_BLOCK = 4096


def _as_row(logits: npt.ArrayLike) -> FloatRow:
    row = np.asarray(logits, dtype=np.float32)
    if row.ndim != 1 or row.size == 0:
        raise ValueError(f"expected a non-empty 1-D logit row, got shape {row.shape}")
    return row


def argmax(logits: npt.ArrayLike) -> int:
    """The first maximum, skipping NaN; 0 when no value beats -inf."""
    row = _as_row(logits)
    # np.argmax answers the first NaN where there is one, so a non-NaN answer means the row
    # has none and is the answer (one pass over the row instead of three on every greedy step).
    best = int(np.argmax(row))
    if not np.isnan(row[best]):
        return best
    # NaN never wins; with every value -inf (or NaN) colibri answers 0, and so does
    # np.argmax over an all -inf row.
    return int(np.argmax(np.where(np.isnan(row), np.float32(-np.inf), row)))


def _sequential_sum(values: npt.NDArray[np.float64]) -> float:
    # np.sum adds pairwise; colibri adds left to right, which rounds differently.
    return float(np.cumsum(values)[-1]) if values.size else 0.0


def distribution(logits: npt.ArrayLike, temperature: float, top_p: float) -> FloatRow:
    """The float32 sampling distribution over token ids (temperature, then nucleus)."""
    row = _as_row(logits)
    finite = np.isfinite(row)
    probs = np.zeros(row.shape, dtype=np.float32)
    if not finite.any():
        probs[0] = 1.0
        return probs
    best = int(np.argmax(np.where(finite, row, np.float32(-np.inf))))
    peak = row[best]
    temp = np.float32(temperature)
    inv_t = np.float32(1.0) / (temp if temp > _MIN_TEMPERATURE else _MIN_TEMPERATURE)
    scaled = (row[finite] - peak) * inv_t  # float32 arithmetic, as in C
    # expf, correctly rounded: float64 exp rounded once to float32 (a double-rounding
    # miss is too rare to matter). glibc's expf, which colibri calls, is one ulp off on
    # about 0.06% of arguments; see DEVIATIONS for why that is accepted.
    probs[finite] = np.exp(scaled.astype(np.float64)).astype(np.float32)
    total = _sequential_sum(probs.astype(np.float64))
    if not math.isfinite(total) or total <= 0.0:
        probs[:] = 0.0
        probs[best] = 1.0
        return probs
    probs = probs / np.float32(total)
    nucleus = float(np.float32(top_p))
    if 0.0 < nucleus < 1.0:
        probs = nucleus_order(probs, nucleus)
    return probs


#: How many of the most probable tokens are ordered before falling back to a full sort.
_NUCLEUS_PREFIX = 1024


def nucleus_order(probs: FloatRow, nucleus: float, prefix: int = _NUCLEUS_PREFIX) -> FloatRow:
    """``probs`` truncated to the nucleus (see the module docstring).

    Only the head of the (descending probability, ascending id) order matters, so the
    ``prefix`` most probable tokens, plus every token tied with the last of them, are
    ordered first; the full vocabulary is sorted only when their mass stays below
    ``nucleus``. Every token left out is strictly less probable than every token ordered,
    so the kept set is exactly what a full sort gives.
    """
    if probs.size > prefix:
        threshold = np.partition(probs, probs.size - prefix)[probs.size - prefix]
        head = np.flatnonzero(probs >= threshold)
        order = head[np.lexsort((head, -probs[head]))]
        running = np.cumsum(probs[order].astype(np.float64))
        if running[-1] >= nucleus:
            return _keep_prefix(probs, order, running, nucleus)
    # A stable sort of the negated values puts equal probabilities in ascending id order
    # (our tie rule; colibri's heap order is unspecified).
    order = np.argsort(-probs, kind="stable")
    running = np.cumsum(probs[order].astype(np.float64))
    return _keep_prefix(probs, order, running, nucleus)


def _keep_prefix(
    probs: FloatRow,
    order: npt.NDArray[np.intp],
    running: npt.NDArray[np.float64],
    nucleus: float,
) -> FloatRow:
    reached = np.flatnonzero(running >= nucleus)
    kept = int(reached[0]) + 1 if reached.size else probs.size
    kept_ids = order[:kept]
    kept_sum = np.float32(running[kept - 1])
    truncated = np.zeros_like(probs)
    truncated[kept_ids] = probs[kept_ids] / kept_sum
    return truncated


def sample_index(probs: FloatRow, u01: float, ban: int = -1) -> int:
    """The id that a uniform ``u01`` in [0, 1) selects from ``probs`` (``ban`` excluded)."""
    weights = probs.astype(np.float64)
    mass = 1.0 - (float(weights[ban]) if ban >= 0 else 0.0)
    target = u01 * max(mass, 1e-12)
    if ban >= 0:
        weights[ban] = 0.0
    running = np.cumsum(weights)
    hits = running >= target
    if ban >= 0:
        hits[ban] = False
    first = np.flatnonzero(hits)
    if first.size:
        return int(first[0])
    nonzero = np.flatnonzero(weights > 0)
    return int(nonzero[-1]) if nonzero.size else 0


def sample(
    logits: npt.ArrayLike,
    temperature: float,
    top_p: float,
    rng: UniformSource,
    ban: int = -1,
) -> int:
    """colibri's ``pick_tok``: greedy when ``temperature <= 0``, else one draw from ``rng``."""
    if np.float32(temperature) <= 0:
        return argmax(logits)
    return sample_index(distribution(logits, temperature, top_p), rng.uniform(), ban)


# ---------------------------------------------------------------------- log-probabilities
def log_normalizer(logits: npt.ArrayLike) -> float:
    """``max + log(sum exp(l - max))`` in float64, the sum in id order (colibri's logZ).

    The maximum is taken as colibri does: starting from ``l[0]`` and replaced by any larger
    value, so a NaN in position 0 makes every log-probability NaN and later NaNs are
    skipped by the comparison (but still poison the sum).
    """
    row = _as_row(logits)
    peak = float(row[0]) if np.isnan(row[0]) else float(np.nanmax(row))
    wide = row.astype(np.float64)
    # Infinite logits give inf - inf = NaN here, as in C; that is the answer, not a warning.
    with np.errstate(invalid="ignore"):
        return peak + math.log(_sequential_sum(np.exp(wide - peak)))


def log_softmax(logits: npt.ArrayLike) -> npt.NDArray[np.float64]:
    """float64 log-probabilities of every token under the raw logits."""
    row = _as_row(logits)
    return row.astype(np.float64) - log_normalizer(row)


@dataclass(frozen=True)
class LogprobEntry:
    """The log-probability record of one position (a DATA/ECHO tail)."""

    #: Log-probability of the token at this position.
    logprob: float
    #: ``(id, logprob)`` of the k largest logits, in colibri's table order (see below).
    top: tuple[tuple[int, float], ...]

    def tail(self) -> str:
        """The wire tail, as the codec spells it (``Logprobs.tail``)."""
        return Logprobs(self.logprob, self.top).tail()


#: The tail of a position with nothing to condition on (echo position 0).
NO_PREDICTOR_TAIL = NO_PREDICTOR.tail()



def _ids_not_in(size: int, taken: list[int]) -> Iterator[int]:
    # A generator function, not a generator expression: mypyc compiles the latter eagerly.
    for i in range(size):
        if i not in taken:
            yield i


def top_k_table(logits: npt.ArrayLike, k: int) -> list[int]:
    """Ids of the ``k`` largest logits, in colibri's slot order (k clipped to 32 and V).

    colibri fills k slots by min-replacement in one pass over the ids: each logit that is
    larger than the current smallest slot value (the first such slot on ties) takes that
    slot. The table is therefore NOT sorted; it is exactly reproducible, which is what makes
    tails byte-comparable between engines. Slots start empty (colibri: -1e30 with id -1);
    an empty slot loses to any non-NaN logit, so rows with -inf entries still fill every slot
    with a real id, and slots left empty by NaN rows take the lowest unused ids.
    """
    row = _as_row(logits)
    k = max(0, min(k, MAX_TOP_LOGPROBS, row.size))
    if k == 0:
        return []
    ids = [-1] * k
    values = [-math.inf] * k
    filled = 0
    floor = -math.inf  # smallest slot value once every slot is filled
    position = 0
    while position < row.size:
        block = row[position : position + _TOPK_BLOCK]
        # The smallest slot value only grows, so logits at or below it can be skipped
        # without changing the outcome; after the first slots fill, survivors are few.
        if filled < k:
            candidates = np.flatnonzero(~np.isnan(block))
        else:
            candidates = np.flatnonzero(block > floor)
        advance = block.size
        for offset in candidates.tolist():
            value = float(block[offset])
            if filled < k:
                slot = ids.index(-1)
                filled += 1
            else:
                slot = min(range(k), key=values.__getitem__)  # the first minimum
                if not value > values[slot]:
                    continue
            ids[slot] = position + offset
            values[slot] = value
            floor = min(values)
            if filled == k and offset + 1 < block.size:
                # Just filled (or raised the floor): re-filter the rest of this block.
                advance = offset + 1
                break
        position += advance
    if filled < k:
        unused = _ids_not_in(row.size, ids)
        ids = [i if i >= 0 else next(unused) for i in ids]
    return ids


def logprob_entry(
    logits: npt.ArrayLike, token: int, k: int, log_z: float | None = None
) -> LogprobEntry:
    """Log-probability of ``token`` and the top-``k`` table for one logit row.

    ``log_z``, when given, must be ``log_normalizer(logits)``: a caller that needs several
    tables of one row (DATA's tail and TOPK) sums the full vocabulary only once.
    """
    row = _as_row(logits)
    if not 0 <= token < row.size:
        raise ValueError(f"token {token} is outside the vocabulary (size {row.size})")
    if log_z is None:
        log_z = log_normalizer(row)
    top = tuple((i, float(row[i]) - log_z) for i in top_k_table(row, k))
    return LogprobEntry(float(row[token]) - log_z, top)


def sorted_by_logprob(top: tuple[tuple[int, float], ...]) -> list[tuple[int, float]]:
    """A table in presentation order: descending log-probability, ties by ascending id."""
    return sorted(top, key=lambda entry: (-entry[1], entry[0]))
