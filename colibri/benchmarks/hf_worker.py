"""Bench worker for HF transformers eager (standalone: imports torch and transformers only).

Run by colibri.benchmarks.reference_decode with whichever interpreter has torch installed:
``python hf_worker.py --model DIR --tokens N --prompt "3 14 159"``; prints one JSON line.
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path
from typing import Any


def rss_bytes() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def rss_summary(raw: dict[str, Any], checkpoint_bytes: int) -> dict[str, Any]:
    """A worker's RSS after load, absolute and grown over the interpreter it loaded in, each
    against the checkpoint's size. The growth is what the weights cost: the absolute figure
    also holds the interpreter and its libraries (100-200 MB), which dominate it for a small
    container, so a lazily mapped one can read "0.85 of the checkpoint" absolute while the
    load itself added a few percent.

    Where the worker also says how much of the checkpoint's own map is resident then
    (``weights_mapped_after_load``, ``page_mapping.checkpoint_mapping``), the growth is split
    into those page-cache pages, which the kernel shares and can drop, and the rest, which the
    engine allocated. A checkpoint cached in 2 MiB folios maps a whole folio wherever a load
    touches a small tensor, so its share of the growth is mostly bytes never read."""
    after = raw["rss_after_load_bytes"]
    out: dict[str, Any] = {"rss_after_load_bytes": after,
                           "rss_after_load_vs_checkpoint": after / checkpoint_bytes}
    if "rss_before_load_bytes" in raw:
        grown = after - raw["rss_before_load_bytes"]
        out["rss_growth_at_load_bytes"] = grown
        out["rss_growth_at_load_vs_checkpoint"] = grown / checkpoint_bytes
        mapped = raw.get("weights_mapped_after_load")
        if mapped is not None:
            out["rss_growth_in_weight_maps_bytes"] = mapped["resident_bytes"]
            out["weight_maps_in_2mib_entries_fraction"] = mapped["huge_mapped_fraction"]
            out["rss_growth_outside_weight_maps_bytes"] = grown - mapped["resident_bytes"]
    return out


def run(model_dir: Path, tokens: int, prompt: list[int], warmup: int) -> dict[str, Any]:
    rss_before = rss_bytes()
    t0 = time.perf_counter()
    # Imported by name so type-checking this file does not depend on torch being installed.
    torch: Any = importlib.import_module("torch")
    transformers: Any = importlib.import_module("transformers")

    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(model_dir), dtype=torch.float32, attn_implementation="eager"
    )
    model.eval()
    load_s = time.perf_counter() - t0
    rss_after = rss_bytes()
    ids: list[int] = []
    times: list[float] = []
    with torch.no_grad():
        out = model(input_ids=torch.tensor([prompt]), use_cache=True)
        cache = out.cache
        logits = out.logits[0, -1]
        for _ in range(warmup + tokens):
            token = int(torch.argmax(logits))
            ids.append(token)
            t = time.perf_counter()
            out = model(input_ids=torch.tensor([[token]]), cache=cache, use_cache=True)
            times.append(time.perf_counter() - t)
            cache = out.cache
            logits = out.logits[0, -1]
    times = times[warmup:]
    return {
        "load_s": load_s,
        "rss_before_load_bytes": rss_before,
        "rss_after_load_bytes": rss_after,
        "ids": ids,
        "step_s": times,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
        "torch_threads": torch.get_num_threads(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--warmup", type=int, default=4)
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt.split()]
    print(json.dumps(run(args.model, args.tokens, prompt, args.warmup)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
