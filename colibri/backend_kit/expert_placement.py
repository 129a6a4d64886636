"""Which node holds which routed expert: placement by heat and memory (``colibri plan --nodes``).

Every MoE layer of a step sends one call to each node that owns one of the experts its rows
chose, and waits for the slowest: a layer is as fast as its busiest node. So the hottest
experts of each layer are spread first, each to the node that has the least of that layer's
heat so far (longest-processing-time first, layer by layer); ties go to the node holding the
fewest bytes, so memory evens out across layers too, then to the lowest node. A node only
takes an expert that still fits its RAM.

With room to spare, each layer's node heats then differ by at most that layer's hottest expert
(a node is chosen only while it is the coolest, so it ends at most one expert above the
coolest). When memory binds, the hottest experts keep their spread and the cooler ones fill
what is left; layers of larger experts are placed first (first fit decreasing), so small ones
fill the gaps. Placement then never fails while the experts' total is at most ``nodes × RAM −
(nodes − 1) × the largest expert``, and with experts of one size it never fails when they fit
at all. Heat is a usage history's selection counts, or 1 for every expert (uniform).

The result is the ``Placement`` the per-layer call uses (``remote_experts.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from colibri.backend_kit.remote_experts import Placement

Key = tuple[int, int]


class PlacementError(ValueError):
    """The experts cannot be placed on the nodes given (too little RAM, a bad count)."""


def human_bytes(n: float) -> str:
    """Decimal units, three significant digits: a tiny fixture's node is not "0.000 GB"."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} bytes"


def place_experts(layers: Sequence[int], n_experts: int, sizes: Mapping[Key, int],
                  heat: Mapping[Key, float], nodes: int, node_ram_bytes: int) -> Placement:
    """Every (layer, expert) of ``layers`` × ``range(n_experts)`` on one of ``nodes`` nodes of
    ``node_ram_bytes`` each; ``sizes`` gives each expert's bytes (all must be present), ``heat``
    its share of the traffic (missing: 0). Deterministic: the same inputs give the same
    placement."""
    if nodes < 1:
        raise PlacementError(f"--nodes must be at least 1, got {nodes}")
    if node_ram_bytes <= 0:
        raise PlacementError(f"--node-ram must be positive, got {node_ram_bytes} bytes")
    keys = [(layer, e) for layer in sorted(layers) for e in range(n_experts)]
    missing = [k for k in keys if k not in sizes]
    if missing:
        raise PlacementError(f"no size for expert {missing[0][1]} of layer {missing[0][0]}")
    total = sum(sizes[k] for k in keys)
    if total > nodes * node_ram_bytes:
        raise PlacementError(
            f"the routed experts ({human_bytes(total)}) do not fit {nodes} node(s) × "
            f"{human_bytes(node_ram_bytes)}: need at least {-(-total // node_ram_bytes)} "
            f"nodes of this size, or {human_bytes(-(-total // nodes))} per node")
    held = [0] * nodes
    owner: dict[int, tuple[int, ...]] = {}
    largest = {layer: max(sizes[(layer, e)] for e in range(n_experts)) for layer in layers}
    for layer in sorted(layers, key=lambda layer: (-largest[layer], layer)):
        layer_heat = [0.0] * nodes
        table = [-1] * n_experts
        # Hottest first; among equals the larger first (the harder to fit), then by id.
        order = sorted(range(n_experts), key=lambda e: (-heat.get((layer, e), 0.0),
                                                        -sizes[(layer, e)], e))
        for e in order:
            size = sizes[(layer, e)]
            room = [n for n in range(nodes) if held[n] + size <= node_ram_bytes]
            if not room:
                raise PlacementError(
                    f"the routed experts fit {nodes} node(s) × {human_bytes(node_ram_bytes)} "
                    f"in total but not expert by expert: expert {e} of layer {layer} "
                    f"({size} bytes) finds no node with room left; give the nodes a little "
                    "more RAM")
            node = min(room, key=lambda n: (layer_heat[n], held[n], n))
            table[e] = node
            held[node] += size
            layer_heat[node] += heat.get((layer, e), 0.0)
        owner[layer] = tuple(table)
    return Placement(nodes, dict(sorted(owner.items())))


def uniform_heat(layers: Sequence[int], n_experts: int) -> dict[Key, float]:
    """Every expert equally hot: what a placement assumes without a usage history."""
    return {(layer, e): 1.0 for layer in layers for e in range(n_experts)}
