"""A test double of the *device* behind the expert store's VRAM tier (``VramTier``): an
in-memory set of expert slots with a byte capacity, so the store's real tier-2 bookkeeping
can be driven without a GPU. It is never a substitute for the CUDA backend in an end-to-end
test of the model math; it stands only where the device's answers (accepted, refused) are
what is under test.

It checks the store's side of the contract: no expert is uploaded twice, nothing is released
that was not uploaded, and it can refuse (full, or told to refuse given experts).
"""

from __future__ import annotations

from collections.abc import Callable

Key = tuple[int, int]


class InMemoryVram:
    def __init__(self, capacity_bytes: int, size: Callable[[int, int], int],
                 refuse: set[Key] | None = None) -> None:
        self.capacity_bytes = capacity_bytes
        self.size = size
        self.refuse = set(refuse or ())
        self.resident: dict[Key, int] = {}
        self.uploads = 0
        self.refusals = 0

    @property
    def used_bytes(self) -> int:
        return sum(self.resident.values())

    def upload(self, layer: int, expert: int) -> bool:
        key = (layer, expert)
        assert key not in self.resident, f"expert {key} uploaded twice"
        size = self.size(layer, expert)
        if key in self.refuse or self.used_bytes + size > self.capacity_bytes:
            self.refusals += 1
            return False
        self.resident[key] = size
        self.uploads += 1
        return True

    def release(self, layer: int, expert: int) -> None:
        key = (layer, expert)
        assert key in self.resident, f"expert {key} released but not resident"
        del self.resident[key]
