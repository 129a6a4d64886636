"""``colibri plan --nodes N --node-ram GB``: the routed experts placed on the nodes of a cluster.

Sizes are the checkpoint's stored bytes per expert when the weights are there (what a node
holds of them), else the config's arithmetic for ``--format``. Heat is a usage history
(``--usage``: a ``.coli_usage`` or STATS dump) or uniform. The placement itself is
``backend_kit.expert_placement``; the document is ``backend_kit.placement_file``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from colibri.backend_kit.expert_placement import (
    PlacementError,
    human_bytes,
    place_experts,
    uniform_heat,
)
from colibri.backend_kit.placement_file import placement_document
from colibri.plan import (
    GB,
    PlanError,
    expert_bytes_by_format,
    load_config,
    ranked_usage,
    stored_expert_bytes,
)


def plan_placement(model: Path, nodes: int, node_ram_gb: float, usage: Path | None = None,
                   expert_format: str = "bf16") -> dict[str, Any]:
    """The placement document for ``nodes`` nodes of ``node_ram_gb`` GB each; ``PlanError``
    naming the shortfall when the experts do not fit."""
    config, model_dir = load_config(model)
    n_experts = config.n_routed_experts
    sizes = stored_expert_bytes(model_dir) if model_dir is not None else {}
    if sizes:
        layers = sorted({layer for layer, _ in sizes})
        sizes_from = "weights"
    else:
        per_format = expert_bytes_by_format(config)
        if expert_format not in per_format:
            raise PlanError(f"unknown expert format {expert_format!r} (have: "
                            + ", ".join(per_format) + ")")
        layers = [i for i, kind in enumerate(config.mlp_layer_types) if kind == "sparse"]
        layers += [config.num_hidden_layers + i
                   for i in range(config.num_nextn_predict_layers)]
        sizes = {(layer, e): per_format[expert_format] for layer in layers
                 for e in range(n_experts)}
        sizes_from = f"config ({expert_format} experts)"
    if usage is not None:
        heat: dict[tuple[int, int], float] = {(layer, e): float(n) for layer, e, n in
                                              ranked_usage(usage, config) if layer in layers}
        heat_from = f"usage {usage}"
    else:
        heat = uniform_heat(layers, n_experts)
        heat_from = "uniform"
    if not node_ram_gb > 0:
        raise PlanError(f"--node-ram must be positive, got {node_ram_gb}")
    node_ram = int(node_ram_gb * GB)
    try:
        placement = place_experts(layers, n_experts, sizes, heat, nodes, node_ram)
    except PlacementError as exc:
        raise PlanError(str(exc)) from None
    return placement_document(placement, model_path=str(model), model_type=config.model_type,
                              n_experts=n_experts, sizes=sizes, heat=heat,
                              node_ram_bytes=node_ram, sizes_from=sizes_from,
                              heat_from=heat_from)


def format_placement(document: dict[str, Any]) -> list[str]:
    """One line per node: experts, bytes against the node's RAM, share of the heat."""
    ram = document["node_ram_bytes"]
    lines = [f"placement {len(document['nodes'])} nodes × {human_bytes(ram)} · "
             f"{len(document['layers'])} routed layers × "
             f"{document['model']['experts_per_layer']} experts · heat {document['heat_from']}"]
    for node in document["nodes"]:
        lines.append(f"node {node['node']}: {node['experts']} experts · "
                     f"{human_bytes(node['expert_bytes'])} of {human_bytes(ram)} · "
                     f"{100 * node['heat_share']:.1f}% of the heat")
    return lines
