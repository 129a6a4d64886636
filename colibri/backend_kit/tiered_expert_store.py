"""Routed experts in three places, as colibri keeps them: on disk (the memory-mapped
container, read when routed), in a byte-bounded RAM cache (true LRU), and in a pinned hot set
that is never evicted, ranked from the usage history and re-pinned live (REPIN). A backend
that computes on a GPU adds a fourth, VRAM (tier 2): the prefix of the pin ranking that fits
its byte budget, through the backend's ``VramTier`` (spec/DEVIATIONS.md, "The VRAM tier").

The store implements the model's ``ExpertStore`` protocol (``expert(layer, e)``) and the
engine's ``TierReport``, so EMAP's tier bits, TIERS, DONE's hit % and PERF's disk time report
what really happened. Placement never changes the math: a cached or pinned expert holds the
same float32 values as the mapped one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, as_completed, wait
from dataclasses import replace

import numpy as np
import numpy.typing as npt

from colibri.backend_kit.expert_disk import gather
from colibri.backend_kit.layer_lru import PerLayerLru
from colibri.engine.backend import (
    TIER_DISK,
    TIER_RAM,
    TIER_VRAM,
    Repin,
    StoreCounters,
    TierCounts,
    VramTier,
)
from colibri.reference.config import ModelConfig
from colibri.reference.expert_lru import Key
from colibri.reference.experts import ExpertWeights, expert_tensor_names
from colibri.reference.weights import TensorLoader

#: Reads one expert's float32 weights from the container (the disk tier), uncached.
ExpertReader = Callable[[int, int], ExpertWeights]
#: Starts reading several experts, their reads in flight together: one future each, in the
#: keys' order (``DiskTier.submit``).
ExpertSubmit = Callable[[Sequence[Key]], list[Future[ExpertWeights]]]
#: An expert's bytes as stored in the container (``experts.stored_expert_bytes``).
StoredBytes = Callable[[int, int], int]


def mapped_reader(loader: TensorLoader, cfg: ModelConfig) -> ExpertReader:
    """Float checkpoints: copy the expert out of the memory-mapped safetensors."""
    d, inter = cfg.hidden_size, cfg.moe_intermediate_size

    def read(layer: int, expert: int) -> ExpertWeights:
        gate, up, down = expert_tensor_names(layer, expert)
        return ExpertWeights(
            gate=np.array(loader.get(gate, (inter, d)), dtype=np.float32, copy=True),
            up=np.array(loader.get(up, (inter, d)), dtype=np.float32, copy=True),
            down=np.array(loader.get(down, (d, inter)), dtype=np.float32, copy=True),
        )

    return read


def _read_now(read: ExpertReader) -> ExpertSubmit:
    """A submit for a reader with nothing to overlap: it reads at once, in order."""

    def submit(keys: Sequence[Key]) -> list[Future[ExpertWeights]]:
        futures: list[Future[ExpertWeights]] = []
        for key in keys:
            future: Future[ExpertWeights] = Future()
            futures.append(future)
            try:
                future.set_result(read(*key))
            except Exception as exc:  # noqa: BLE001 - the future carries it to ``gather``
                future.set_exception(exc)
        return futures

    return submit


class PendingExperts:
    """One layer's lookups, made: the resident experts at hand, the misses in flight."""

    def __init__(self, store: TieredExpertStore, ids: list[int],
                 found: list[ExpertWeights | None], missing: list[int], keys: list[Key],
                 reads: _Reads | None) -> None:
        self._store, self._ids, self._found = store, ids, found
        self._missing, self._keys, self._reads = missing, keys, reads

    def resident(self) -> list[tuple[int, ExpertWeights]]:
        """(expert, weights) of the experts that were resident, in lookup order."""
        return [(e, w) for e, w in zip(self._ids, self._found, strict=True) if w is not None]

    @property
    def waiting(self) -> bool:
        return self._reads is not None

    def arrivals(self) -> Iterator[tuple[int, ExpertWeights]]:
        """(expert, weights) of the misses one at a time, in the order their reads end, so
        the caller computes each while the others are still being read; the LRU holds them
        where their reservations stood once every read has ended. A failed read (or a caller
        that stops early) lets every read end and leaves nothing of the layer's misses
        behind: an expert given before the failure must not be used past it."""
        if self._reads is None:
            return
        reads, self._reads = self._reads, None
        try:
            for i in reads.in_order_of_arrival():
                weights = reads.futures[i].result()
                self._found[self._missing[i]] = weights
                yield self._ids[self._missing[i]], weights
            reads.book()
        except BaseException:
            reads.end_all()
            self._store._unreserve(self._keys)
            raise
        self._store._settle(self._keys, [f.result() for f in reads.futures])

    def wait(self) -> list[tuple[int, ExpertWeights]]:
        """(expert, weights) of the misses, once all are read (in lookup order)."""
        for _ in self.arrivals():
            pass
        return [(self._ids[i], self._found[i]) for i in self._missing  # type: ignore[misc]
                if self._found[i] is not None]

    def all(self) -> list[ExpertWeights]:
        """Every expert, in lookup order (waiting for the misses)."""
        self.wait()
        return [w for w in self._found if w is not None]


class _Reads:
    """A layer's misses in flight: one future per key, and the disk time and bytes to book
    once they have all been read."""

    def __init__(self, store: TieredExpertStore, futures: list[Future[ExpertWeights]],
                 fresh: list[Key]) -> None:
        self.futures, self._store, self._fresh = futures, store, fresh
        self._started = time.perf_counter()

    def in_order_of_arrival(self) -> Iterator[int]:
        """The futures' indices as each ends (already ended ones first, in key order)."""
        index = {id(f): i for i, f in enumerate(self.futures)}
        running = []
        for i, future in enumerate(self.futures):
            if future.done():
                yield i
            else:
                running.append(future)
        for future in as_completed(running):
            yield index[id(future)]

    def results(self) -> list[ExpertWeights]:
        """Every expert in key order, the time and bytes booked (``gather``'s failure rule)."""
        weights = gather(self.futures)
        self.book()
        return weights

    def end_all(self) -> None:
        """Wait until no read is in flight (no read outlives a failed layer)."""
        wait(self.futures)

    def book(self) -> None:
        counters = self._store._counters
        counters.disk_seconds += time.perf_counter() - self._started
        counters.disk_bytes += sum(self._store.stored_bytes(key) for key in self._fresh)


class _Reserved:
    """An LRU entry held for an expert whose read is in flight: it takes the expert's
    place (and bytes) in the recency order, so a layer's lookups made together leave the
    cache exactly as the same lookups made one at a time."""

    __slots__ = ("nbytes",)

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


class TieredExpertStore:
    def __init__(
        self,
        read: ExpertReader,
        cfg: ModelConfig,
        layers: Sequence[int],
        ram_budget_bytes: int,
        stored_bytes: StoredBytes,
        vram: VramTier | None = None,
        vram_budget_bytes: int = 0,
        gpu: int = 0,
        read_submit: ExpertSubmit | None = None,
        held_bytes: StoredBytes | None = None,
    ) -> None:
        self.read = read
        self.read_submit: ExpertSubmit = read_submit or _read_now(read)
        #: Whether reads run beside the caller (a disk tier): only then is a prefetch worth it.
        self.reads_overlap = read_submit is not None
        #: Experts read ahead of their lookup (``prefetch``): their reads, in flight or done.
        #: They are held beside the LRU, not in it (a wrong guess evicts nothing), within
        #: ``read_ahead_bytes``: the part of a budget's reserve for one step's experts that a
        #: step of few rows leaves unused (``expert_tiers``); 0 reads nothing ahead.
        self._ahead: dict[Key, Future[ExpertWeights]] = {}
        self.read_ahead_bytes = 0
        self.cfg = cfg
        # Reported bytes (TIERS, disk reads) are stored bytes; the RAM budget bounds what
        # this process really holds (weights.nbytes), which differs between backends.
        self._stored_bytes = stored_bytes
        self._stored: dict[Key, int] = {}
        self.layers = list(layers)
        # RAM_GB=0 means unbounded (colibri). A bounded store's pins and LRU share the budget:
        # the LRU gets what the pins leave.
        self.ram_budget_bytes = ram_budget_bytes
        self._lru = PerLayerLru(self.layers, ram_budget_bytes or None)
        #: How often the RSS guard lowered the LRU's budget, and who is told the new budget
        #: (the disk tier, whose reserved read buffers must shrink with it).
        self.guard_trims = 0
        self.on_trim: Callable[[int], None] | None = None
        self._pinned: dict[Key, ExpertWeights] = {}
        self._counters = StoreCounters()
        # Decayed per-expert heat for re-pinning: +1 per use, halved after every pass.
        self._heat: dict[Key, int] = {}
        d, inter = cfg.hidden_size, cfg.moe_intermediate_size
        self.expert_bytes = 3 * d * inter * 4
        #: What a read expert occupies in this process (float32 by default; a backend that
        #: keeps stored bytes says so), known before it is read.
        self.held_bytes: StoredBytes = held_bytes or (lambda _layer, _e: self.expert_bytes)
        # Tier 2: the experts the device holds, their stored bytes against the budget. The
        # store keeps no host copy of them (colibri's CUDA_RELEASE_HOST): the backend computes
        # them on the device, and the disk tier is a memory map the backend uploads from.
        self._vram_tier = vram
        self.vram_budget_bytes = vram_budget_bytes if vram is not None else 0
        self.gpu = gpu
        self._vram: dict[Key, int] = {}
        self.vram_bytes = 0

    def attach_vram(self, vram: VramTier, budget_bytes: int, gpu: int = 0) -> None:
        """Give the store a device tier after construction (a backend that opens its device
        after the store), before anything is placed there."""
        if self._vram:
            raise ValueError("the VRAM tier already holds experts")
        self._vram_tier = vram
        self.vram_budget_bytes = budget_bytes
        self.gpu = gpu

    # --- the model's ExpertStore protocol -------------------------------------------------

    def expert(self, layer: int, expert: int) -> ExpertWeights:
        return self.experts(layer, [expert])[0]

    def experts(self, layer: int, ids: Sequence[int]) -> list[ExpertWeights]:
        """Layer ``layer``'s experts ``ids`` (distinct, in lookup order): the resident ones
        from their tier, the others read from disk together, their reads in flight at once.
        Counters, heat and the LRU's order end as the same lookups one at a time leave them."""
        return self.experts_begin(layer, ids).all()

    def experts_begin(self, layer: int, ids: Sequence[int]) -> PendingExperts:
        """``experts`` in two halves: the lookups are made now (the resident experts are at
        hand, the misses' reads in flight), ``wait`` gives the misses; meanwhile the caller
        can compute with the resident ones. An expert read ahead (``prefetch``) is a hit if
        its read is done (it was in RAM) and otherwise a miss that waits on that read; the
        layer's guesses nobody asked for are dropped."""
        found: list[ExpertWeights | None] = []
        missing: list[int] = []
        ahead: dict[Key, Future[ExpertWeights]] = {}
        for expert in ids:
            key = (layer, expert)
            self._counters.lookups += 1
            self._heat[key] = self._heat.get(key, 0) + 1
            held = self._resident(key)
            guess = self._ahead.pop(key, None)
            if guess is not None:
                self._counters.prefetch_used += 1
                if held is None and guess.done() and guess.exception() is None:
                    held = guess.result()
                    self._lru.put(key, held)  # where a miss read now would go
                elif held is None and not guess.done():
                    ahead[key] = guess
            if held is not None:
                self._counters.hits += 1
            else:
                missing.append(len(found))
                self._lru.put(key, _Reserved(self.held_bytes(*key)))  # type: ignore[arg-type]
            found.append(held)
        for key in [k for k in self._ahead if k[0] == layer]:
            # A wrong guess: a read still queued never starts, one running is let go.
            self._ahead.pop(key).cancel()
        keys = [(layer, ids[i]) for i in missing]
        reads = None
        if keys:
            try:
                reads = self._start(keys, ahead)
            except BaseException:
                self._unreserve(keys)
                raise
        return PendingExperts(self, list(ids), found, missing, keys, reads)

    def _start(self, keys: Sequence[Key], ahead: dict[Key, Future[ExpertWeights]] | None = None
               ) -> _Reads:
        """Start the reads of ``keys`` (the disk tier) but those already read ahead; the
        disk time is booked from now."""
        ahead = ahead or {}
        fresh = [key for key in keys if key not in ahead]
        submitted = iter(self.read_submit(fresh) if fresh else [])
        futures = [ahead[key] if key in ahead else next(submitted) for key in keys]
        return _Reads(self, futures, fresh)

    def prefetch(self, layer: int, ids: Iterable[int]) -> int:
        """Start reading layer ``layer``'s experts ``ids`` before its routing asks for them (a
        guess): those neither resident nor already on their way, while they fit
        ``read_ahead_bytes``. Returns how many reads were started (0 where reads do not
        overlap the caller: nothing would be gained)."""
        if not self.reads_overlap or not self.read_ahead_bytes:
            return 0
        room = self.read_ahead_bytes - sum(self.held_bytes(*key) for key in self._ahead)
        keys = []
        for e in ids:
            key = (layer, e)
            if key in self._ahead or self.is_resident(layer, e):
                continue
            room -= self.held_bytes(*key)
            if room < 0:
                break
            keys.append(key)
        if not keys:
            return 0
        for key, future in zip(keys, self.read_submit(keys), strict=True):
            self._ahead[key] = future
        self._counters.prefetched += len(keys)
        self._counters.disk_bytes += sum(self.stored_bytes(key) for key in keys)
        return len(keys)

    def _take_cached(self, key: Key) -> ExpertWeights | None:
        """Take ``key`` out of the LRU: its weights if it was read, None if it was not there
        or still on its way (its reservation goes)."""
        weights = self._lru.pop(key)
        return None if isinstance(weights, _Reserved) else weights

    def _lru_entry(self, key: Key) -> object:
        """The LRU's entry for ``key`` without refreshing it (None when absent)."""
        return self._lru.peek(key)

    def _unreserve(self, keys: Sequence[Key]) -> None:
        """Nothing of a failed read stays, reservations included."""
        for key in keys:
            if isinstance(self._lru_entry(key), _Reserved):
                self._lru.pop(key)

    def _settle(self, keys: Sequence[Key], weights: Sequence[ExpertWeights]) -> None:
        for key, w in zip(keys, weights, strict=True):
            self._lru.replace(key, w)

    def _resident(self, key: Key) -> ExpertWeights | None:
        if key in self._vram:
            # Resident on the device, so a hit; a backend computing it on the host anyway
            # gets the weights uncached (they are in no RAM tier).
            return self.read(*key)
        pinned = self._pinned.get(key)
        if pinned is not None:
            return pinned
        held = self._lru.get(key)
        return None if isinstance(held, _Reserved) else held

    def is_resident(self, layer: int, expert: int) -> bool:
        key = (layer, expert)
        return key in self._vram or key in self._pinned or self._cached(key)

    def _cached(self, key: Key) -> bool:
        """In the LRU and read (a reservation is an expert still on its way)."""
        return key in self._lru and not isinstance(self._lru_entry(key), _Reserved)

    def in_vram(self, layer: int, expert: int) -> bool:
        """Whether the device holds the expert (the backend then computes it there)."""
        return (layer, expert) in self._vram

    def vram_experts(self) -> int:
        return len(self._vram)

    def tier_of(self, key: Key) -> int:
        if key in self._vram:
            return TIER_VRAM
        return TIER_RAM if key in self._pinned or self._cached(key) else TIER_DISK

    def _read(self, key: Key) -> ExpertWeights:
        """Bring an expert from the container (the disk tier) into RAM (the read ahead of it,
        if there is one)."""
        ahead = self._ahead.pop(key, None)
        return self._start([key], {key: ahead} if ahead is not None else None).results()[0]

    def stored_bytes(self, key: Key) -> int:
        """The expert's bytes in the container (what TIERS and the disk counters count)."""
        found = self._stored.get(key)
        if found is None:
            found = self._stored[key] = self._stored_bytes(*key)
        return found

    # --- pinning -----------------------------------------------------------------------------

    def pin(self, ranked: Iterable[Key], budget_bytes: int) -> int:
        """Place the ranked experts: with a VRAM tier, the prefix that fits its budget goes to
        the device (then, budget left, the unranked experts in id order: an idle slot helps no
        one); the rest of the ranking is pinned in RAM while it fits ``budget_bytes``. Returns
        how many experts were placed (VRAM and RAM)."""
        order = list(ranked)
        count = 0
        if self._vram_tier is not None:
            count, order = self._place_vram(order)
        used = sum(w.nbytes for w in self._pinned.values())
        for key in order:
            if key in self._pinned or key in self._vram:
                continue
            if used + self.expert_bytes > budget_bytes:
                break
            if self.ram_budget_bytes and used + self.held_bytes(*key) > self.ram_budget_bytes:
                break
            weights = self._take_cached(key)
            if weights is None:
                weights = self._read(key)
            self._pinned[key] = weights
            used += weights.nbytes
            count += 1
        if self.ram_budget_bytes:
            self._lru.resize(self.ram_budget_bytes - used)
        return count

    def _place_vram(self, ranked: list[Key]) -> tuple[int, list[Key]]:
        """Upload the ranking's prefix that fits the VRAM budget; (uploaded, the rest)."""
        chosen = set(ranked)
        fill = [(layer, e) for layer in self.layers for e in range(self.cfg.n_routed_experts)
                if (layer, e) not in chosen]
        count = 0
        for i, key in enumerate(ranked + fill):
            if key in self._vram:
                continue
            if not self._admit_vram(key):
                return count, ranked[i:] if i < len(ranked) else []
            count += 1
        return count, []

    def _admit_vram(self, key: Key) -> bool:
        """Move one expert to the device if it fits the budget and the device accepts it; it
        leaves its RAM tier (the device copy is the one computed with)."""
        size = self.stored_bytes(key)
        tier = self._vram_tier
        if tier is None or self.vram_bytes + size > self.vram_budget_bytes:
            return False
        if not tier.upload(*key):
            return False
        self._pinned.pop(key, None)
        self._lru.pop(key)
        self._vram[key] = size
        self.vram_bytes += size
        return True

    def _evict_vram(self, key: Key) -> None:
        assert self._vram_tier is not None
        self._vram_tier.release(*key)
        self.vram_bytes -= self._vram.pop(key)

    def _repin_vram(self, layer: int) -> Repin | None:
        """colibri on CUDA: swap the layer's coldest VRAM expert for its hottest expert
        elsewhere when the heat differs by more than 1. The demoted expert takes the promoted
        one's place (pinned stays pinned, cached stays cached, disk stays disk), so every
        other tier keeps its size; a refused upload puts the demoted expert back."""
        on_device = [k for k in self._vram if k[0] == layer]
        if not on_device:
            return None
        cold = min(on_device, key=lambda k: (self._heat.get(k, 0), k[1]))
        elsewhere = [(layer, e) for e in range(self.cfg.n_routed_experts)
                     if (layer, e) not in self._vram]
        if not elsewhere:
            return None
        hot = max(elsewhere, key=lambda k: (self._heat.get(k, 0), -k[1]))
        if self._heat.get(hot, 0) - self._heat.get(cold, 0) <= 1:
            return None
        old_tier = self.tier_of(hot)
        was_pinned = hot in self._pinned
        self._evict_vram(cold)
        if not self._admit_vram(hot):
            if not self._admit_vram(cold):
                self._demote(cold, pinned=False, cached=True)
            return None
        self._demote(cold, pinned=was_pinned, cached=old_tier == TIER_RAM and not was_pinned)
        return Repin(layer, hot[1], old_tier, self.gpu)

    def _demote(self, key: Key, *, pinned: bool, cached: bool) -> None:
        if pinned:
            self._pinned[key] = self._read(key)
        elif cached:
            self._lru.put(key, self._read(key))

    def repin(self) -> list[Repin]:
        """Per layer, first the VRAM swap (with a VRAM tier), then swap the coldest pinned
        expert for the hottest unpinned one when it is clearly hotter (colibri's hysteresis:
        hot > cold + cold/4 + 4); then decay heat."""
        swaps: list[Repin] = []
        for layer in self.layers:
            if self._vram_tier is not None:
                moved = self._repin_vram(layer)
                if moved is not None:
                    swaps.append(moved)
            pinned = [k for k in self._pinned if k[0] == layer]
            if not pinned:
                continue
            cold = min(pinned, key=lambda k: (self._heat.get(k, 0), k[1]))
            candidates = [
                (layer, e)
                for e in range(self.cfg.n_routed_experts)
                if (layer, e) not in self._pinned and (layer, e) not in self._vram
            ]
            if not candidates:
                continue
            hot = max(candidates, key=lambda k: (self._heat.get(k, 0), -k[1]))
            h_cold, h_hot = self._heat.get(cold, 0), self._heat.get(hot, 0)
            if h_hot > h_cold + h_cold // 4 + 4:
                old_tier = TIER_RAM if self._cached(hot) else TIER_DISK
                weights = self._take_cached(hot)
                if weights is None:
                    weights = self._read(hot)
                demoted = self._pinned.pop(cold)
                self._pinned[hot] = weights
                self._lru.put(cold, demoted)
                swaps.append(Repin(layer, hot[1], old_tier))
        for key in self._heat:
            self._heat[key] >>= 1
        return swaps

    # --- TierReport ------------------------------------------------------------------------

    def tier_matrix(self, rows: Sequence[int], n_experts: int) -> npt.NDArray[np.uint8]:
        out = np.zeros((len(rows), n_experts), np.uint8)
        for r, layer in enumerate(rows):
            for e in range(n_experts):
                out[r, e] = self.tier_of((layer, e))
        return out

    def tier_counts(self, rows: Sequence[int], n_experts: int) -> TierCounts:
        wanted = set(rows)
        resident = [k for k in (*self._pinned, *self._lru)
                    if k[0] in wanted and (k in self._pinned or self._cached(k))]
        vram = [k for k in self._vram if k[0] in wanted]
        total = len(rows) * n_experts
        # The tiers are disjoint: pinning takes an expert out of the LRU, an upload out of
        # both, so colibri's ram = pinned - vram + lru is simply the RAM-held count here.
        ram_bytes = sum(self.stored_bytes(k) for k in resident)
        vram_bytes = sum(self._vram[k] for k in vram)
        return TierCounts(len(vram), len(resident), total - len(resident) - len(vram),
                          vram_bytes, ram_bytes)

    @property
    def expert_cache_bytes(self) -> int:
        return self.ram_budget_bytes

    def trim(self, excess_bytes: int) -> int:
        """colibri's RSS guard: the process holds ``excess_bytes`` more than its budget, so
        the LRU's budget drops by that much (least recently used experts go; pins stay).
        Returns the bytes the LRU let go."""
        before = self._lru.bytes
        limit = self._lru.budget_bytes if self._lru.budget_bytes is not None else before
        self._lru.resize(max(0, min(limit, before) - excess_bytes))
        self.guard_trims += 1
        if self.on_trim is not None:
            self.on_trim(self._lru.budget_bytes or 0)
        return before - self._lru.bytes

    def counters(self) -> StoreCounters:
        return replace(self._counters)  # a snapshot; vars() fails on mypyc-compiled classes
