"""Bench section ``cluster``: the routed experts on Ray expert workers (docs/cluster.md).

Two measurements, each in a process of its own (each starts and stops its own simulated Ray
cluster; a Ray that misbehaves costs only its deadline):

* ``decode``: glm5-tiny (or ``--model``) decoded at batch 1 by the single process and by the
  clustered engine on a simulated two-node cluster, side by side: tok/s, their ratio, and the
  per-layer round trip (median, p90) the clustered engine measured;
* ``transport``: the per-layer call alone: the engine's direct channels, plain actor calls
  and a Ray compiled graph (``cluster_transport.py`` says why the compiled graph runs on one
  node only).

Needs Ray (the ``cluster`` extra); without it the section is refused.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register, workers

#: A layer call's payload in the transport probe: one decode row of glm5-tiny's width.
TRANSPORT_ROWS, TRANSPORT_HIDDEN = 1, 128
TRANSPORT_CALLS = 300
DEADLINE_S = 600.0


def run(options: BenchOptions) -> dict[str, Any]:
    if importlib.util.find_spec("ray") is None:
        return {"refused": "needs Ray: pip install 'colibri[cluster]'"}
    from colibri import resources

    model = options.model or resources.fixture_model_dir("glm5-tiny")
    # The decode is short and per step: at least 64 tokens make a median worth reading.
    tokens = max(64, options.tokens)
    decode = workers.call("cluster_decode:measure",
                          {"model": str(model), "backends": ["reference", "accelerated"],
                           "tokens": tokens, "warmup": options.warmup},
                          "cluster decode", timeout_s=DEADLINE_S)
    transport = workers.call("cluster_transport:measure",
                             {"rows": TRANSPORT_ROWS, "hidden": TRANSPORT_HIDDEN,
                              "calls": TRANSPORT_CALLS, "warmup": 30},
                             "cluster transport", timeout_s=DEADLINE_S)
    return {"decode": decode, "transport": transport,
            "transport_used": "direct channels (docs/cluster.md, 'Latency')"}


register(
    Section(
        name="cluster",
        engines=("reference", "accelerated"),
        description="expert workers on a simulated 2-node Ray cluster: decode vs single "
        "process, per-layer round trip, direct channels vs plain calls vs compiled graphs",
        run=run,
    )
)
