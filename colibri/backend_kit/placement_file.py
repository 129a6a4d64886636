"""The placement file: a ``Placement`` as a JSON document (spec/schemas/expert_placement.json).

``colibri plan --nodes N --node-ram GB --placement-out FILE`` writes it; ``--cluster-placement
FILE`` makes the cluster start one expert worker per node of the file, each holding the experts
the file gives it. Reading checks the document against its schema, then against the model the
engine opened: a file made for another model (other routed layers, another expert count) is
refused with ``PlacementMismatchError`` before any worker starts, since its owners would name
experts the model does not have, or leave some of its experts with no owner.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from colibri.backend_kit.remote_experts import Placement

SCHEMA_VERSION = 1
KIND = "colibri-expert-placement"

Key = tuple[int, int]


class PlacementFileError(ValueError):
    """The placement file cannot be read or is not a placement document."""


class PlacementMismatchError(PlacementFileError):
    """The placement file was made for another model."""


def placement_document(placement: Placement, *, model_path: str, model_type: str,
                       n_experts: int, sizes: Mapping[Key, int], heat: Mapping[Key, float],
                       node_ram_bytes: int, sizes_from: str, heat_from: str) -> dict[str, Any]:
    """The document of ``placement``, with each node's experts, bytes and share of the heat."""
    layers = sorted(placement.owner)
    total_heat = sum(heat.get((layer, e), 0.0) for layer in layers for e in range(n_experts))
    nodes = []
    for node in range(placement.owners):
        owned = placement.owned(node)
        node_heat = sum(heat.get(k, 0.0) for k in owned)
        nodes.append({"node": node, "experts": len(owned),
                      "expert_bytes": sum(sizes[k] for k in owned),
                      "heat_share": round(node_heat / total_heat, 6) if total_heat else 0.0})
    return {
        "schema_version": SCHEMA_VERSION,
        "kind": KIND,
        "model": {"path": model_path, "model_type": model_type, "routed_layers": layers,
                  "experts_per_layer": n_experts, "sizes_from": sizes_from},
        "node_ram_bytes": node_ram_bytes,
        "heat_from": heat_from,
        "nodes": nodes,
        "layers": [{"layer": layer, "owner": list(placement.owner[layer])} for layer in layers],
    }


def write_placement(path: Path, document: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def _schema_errors(document: object) -> list[str]:
    import jsonschema

    from colibri import resources

    schema = json.loads(resources.spec_path("schemas", "expert_placement.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    return [f"{'/'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(document), key=lambda e: list(e.path))]


def read_placement(path: Path, layers: Sequence[int], n_experts: int) -> Placement:
    """The placement of ``path`` for a model whose routed experts are ``layers`` ×
    ``n_experts``: ``PlacementFileError`` when it is unreadable or breaks the schema,
    ``PlacementMismatchError`` when it was made for another model."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PlacementFileError(f"placement file {path} does not exist") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise PlacementFileError(f"placement file {path} cannot be read: {exc}") from None
    errors = _schema_errors(document)
    if errors:
        raise PlacementFileError(f"placement file {path} is not a placement document "
                                 f"(spec/schemas/expert_placement.json): {errors[0]}")
    model = document["model"]
    want = sorted(layers)
    if sorted(model["routed_layers"]) != want or model["experts_per_layer"] != n_experts:
        raise PlacementMismatchError(
            f"placement file {path} was made for another model ({model['path']}: routed "
            f"layers {model['routed_layers']} × {model['experts_per_layer']} experts); this "
            f"model has routed layers {want} × {n_experts} experts: run colibri plan "
            "--nodes N --node-ram GB --placement-out FILE on this model")
    owners = len(document["nodes"])
    table: dict[int, tuple[int, ...]] = {}
    for entry in document["layers"]:
        owner = entry["owner"]
        if len(owner) != n_experts:
            raise PlacementMismatchError(
                f"placement file {path}: layer {entry['layer']} lists {len(owner)} owners, "
                f"this model has {n_experts} experts per layer")
        if max(owner) >= owners:
            raise PlacementFileError(f"placement file {path}: layer {entry['layer']} names "
                                     f"node {max(owner)}, the file has {owners} nodes")
        table[entry["layer"]] = tuple(owner)
    if sorted(table) != want:
        raise PlacementMismatchError(
            f"placement file {path} places layers {sorted(table)}; this model's routed "
            f"layers are {want}")
    return Placement(owners, table)
