"""validate: leave-one-prompt-out (colibri's validate.py, notes/colibri-tools.md §1.5), and
the label-permutation null this project adds so that a result can be judged at all.

Each category's top-K specialist set is built from its *other* prompts (pure lift, no gates);
the held-out prompt's routing is scored against every category's set and the best one is the
prediction. On a random-weight model the router still separates scripts and code by token
identity, so raw accuracy is not at chance: the null (category labels shuffled across
prompts, same shapes) says what accuracy and how many specialists structure-free labels get.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from colibri.atlas.analyze import analyze
from colibri.atlas.stats import Key, Run, by_category


@dataclass(frozen=True)
class Trial:
    category: str
    index: str
    own: float
    best_other: float
    predicted: str

    @property
    def hit(self) -> bool:
        return self.predicted == self.category


@dataclass
class Validation:
    categories: list[str]
    k: int
    trials: list[Trial] = field(default_factory=list)

    @property
    def hits(self) -> int:
        return sum(t.hit for t in self.trials)

    @property
    def accuracy(self) -> float:
        return self.hits / len(self.trials) if self.trials else 0.0


def _specialists(groups: dict[str, list[Run]], cat: str, exclude: Run | None,
                 k: int) -> set[Key]:
    share: dict[Key, dict[str, float]] = {}
    for c, runs in groups.items():
        used = [r for r in runs if r is not exclude]
        for run in used:
            tot = max(1, run.total)
            for key, n in run.counts.items():
                row = share.setdefault(key, {})
                row[c] = row.get(c, 0.0) + n / tot / len(used)
    scored = []
    for key, row in share.items():
        s = sum(row.values())
        own = row.get(cat, 0.0)
        if s > 0 and own > 0:
            scored.append((own / s, key))
    scored.sort(reverse=True)
    return {key for _, key in scored[:k]}


def validate(runs: list[Run], k: int = 200) -> Validation:
    groups = by_category(runs)
    cats = list(groups)
    out = Validation(cats, k)
    full = {c: _specialists(groups, c, None, k) for c in cats}
    for c in cats:
        for held in groups[c]:
            sets = {cc: (_specialists(groups, c, held, k) if cc == c else full[cc])
                    for cc in cats}
            tot = max(1, held.total)
            scores = {cc: sum(held.counts.get(key, 0) for key in sets[cc]) / tot
                      for cc in cats}
            winner = max(cats, key=lambda cc: scores[cc])
            other = max(scores[cc] for cc in cats if cc != c)
            out.trials.append(Trial(c, held.index, scores[c], other, winner))
    return out


def permuted(runs: list[Run], rng: random.Random) -> list[Run]:
    """The same runs with their category labels shuffled (category sizes kept)."""
    labels = [run.category for run in runs]
    rng.shuffle(labels)
    return [replace(run, category=label) for run, label in zip(runs, labels, strict=True)]


@dataclass(frozen=True)
class Null:
    permutations: int
    accuracies: list[float]
    specialists: list[int]

    @property
    def mean_accuracy(self) -> float:
        return sum(self.accuracies) / len(self.accuracies)

    def p_value(self, accuracy: float) -> float:
        """(1 + #null >= observed) / (1 + permutations): never 0."""
        return (1 + sum(a >= accuracy for a in self.accuracies)) / (1 + self.permutations)


def permutation_null(runs: list[Run], k: int, permutations: int, seed: int,
                     min_count: int = 30, min_runs: int = 2,
                     progress: Callable[[int], None] | None = None) -> Null:
    rng = random.Random(seed)
    accuracies, specialists = [], []
    for i in range(permutations):
        shuffled = permuted(runs, rng)
        accuracies.append(validate(shuffled, k).accuracy)
        specialists.append(len(analyze(shuffled, min_count, min_runs).specialists))
        if progress is not None:
            progress(i + 1)
    return Null(permutations, accuracies, specialists)


def report(result: Validation, say: Callable[[str], None]) -> None:
    n = len(result.categories)
    say(f"leave-one-prompt-out, {n} categories, top-{result.k} specialists per category")
    say(f"chance = {100 / n:.1f}%")
    for t in result.trials:
        verdict = "HIT " if t.hit else f"MISS (predicted {t.predicted})"
        say(f"  {t.category:<12} prompt {t.index}  own-set {100 * t.own:5.2f}%  "
            f"best-other {100 * t.best_other:5.2f}%  -> {verdict}")
    say(f"accuracy: {result.hits}/{len(result.trials)} = {100 * result.accuracy:.1f}%   "
        f"(chance {100 / n:.1f}%)")
