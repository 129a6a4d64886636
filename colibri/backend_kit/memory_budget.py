"""RAM_GB as a budget for everything the engine process holds, split at start-up.

colibri's ``RAM_GB`` bounds its expert cache; what else the process holds (the dense weights,
the KV caches, the runtime) comes on top, and outside a memory cgroup nothing bounds it. Here
the budget is the whole process: the backend opens the model, measures what it holds before
any expert is read, and gives the routed-expert tiers (pinned hot set + LRU) only what is left:

- **runtime**: what the process holds once the model is open and before any expert is read,
  besides the dense weights (the interpreter, numpy, the kernel library, weights converted
  at load), measured;
- **dense**: the file bytes of every weight that is not a routed expert (mapped pages become
  resident as the model runs, and a memory cgroup charges them);
- **kv**: every KV slot at the full context, with the growth headroom the states keep
  (``KVLayer`` grows by doubling, so up to twice the rows in use);
- **step**: one layer's routed experts for a step's rows (a few rows, ``expert_tiers``),
  held while they compute even when the cache has let them go.

What is left is the expert cache. A budget that cannot hold one layer's experts for one token
beside the rest cannot run a step without exceeding it, so start-up refuses it with
``BudgetTooSmall`` naming the minimum for this model and context.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

GB = 1e9
PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class BudgetTooSmall(ValueError):
    """RAM_GB cannot hold the dense weights, the KV caches and one step's experts."""


@dataclass(frozen=True)
class MemoryBudget:
    total: int
    runtime: int
    dense: int
    kv: int
    step: int

    @property
    def fixed(self) -> int:
        """What the process holds whatever the routing."""
        return self.runtime + self.dense + self.kv + self.step

    @property
    def experts(self) -> int:
        """The bytes left for the routed-expert tiers (pinned + LRU)."""
        return self.total - self.fixed

    def describe(self) -> str:
        return (f"RAM budget {self.total / GB:.2f} GB: runtime {self.runtime / GB:.2f}, dense "
                f"{self.dense / GB:.2f}, KV {self.kv / GB:.2f}, a step's experts "
                f"{self.step / GB:.2f}, expert cache {self.experts / GB:.2f} GB "
                f"({self.experts} bytes)")


def split_budget(total: int, *, runtime: int, dense: int, kv: int, step: int) -> MemoryBudget:
    """The budget's parts; ``BudgetTooSmall`` when no expert cache is left."""
    budget = MemoryBudget(total, runtime, dense, kv, step)
    if budget.experts < 0:
        need = budget.fixed
        raise BudgetTooSmall(
            f"RAM_GB={total / GB:.3f} is too small for this model and context: the runtime "
            f"({runtime / GB:.3f} GB), the dense weights ({dense / GB:.3f} GB), the KV caches "
            f"({kv / GB:.3f} GB) and the experts a step holds ({step / GB:.3f} GB) need "
            f"at least RAM_GB={need / GB:.9f}")
    return budget


def runtime_bytes(dense: int) -> int:
    """What this process holds now besides the model's dense weights: its anonymous memory
    (heap, converted weights, buffers) and the file pages it maps other than the dense
    weights' (libraries; ``RssFile`` less ``dense``, which loading has touched). From
    ``/proc/self/status``; 0 where the system does not say."""
    fields: dict[str, int] = {}
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                name, _, rest = line.partition(":")
                if name in ("RssAnon", "RssFile"):
                    fields[name] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return 0
    return fields.get("RssAnon", 0) + max(0, fields.get("RssFile", 0) - dense)


def resident_bytes() -> int:
    """This process's whole resident set now (``/proc/self/statm``: anonymous and mapped file
    pages); 0 where the system does not say."""
    try:
        with open("/proc/self/statm") as fh:
            pages = int(fh.read().split()[1])
    except (OSError, ValueError, IndexError):
        return 0
    return pages * PAGE


def kv_bytes(slots: int, ctx: int, floats_per_position: int) -> int:
    """Every slot's KV state at ``ctx`` positions, with the doubling growth's headroom."""
    return slots * 2 * ctx * floats_per_position * 4
