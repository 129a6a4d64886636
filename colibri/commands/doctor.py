"""``colibri doctor``: report what this installation can do; non-zero exit when broken."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check the installation (versions, package data, engines, GPU)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument("--model", type=Path, default=None,
                        help="also check this model (config, weights, formats) and summarise "
                        "its memory plan (default: the embedded model)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from colibri import doctor, resources

    model = args.model if args.model is not None else resources.default_model_dir()
    cuda = doctor.cuda_probe()
    checks = doctor.run_checks(cuda) + doctor.check_model(model)
    result = doctor.report(checks, model, doctor.plan_summary(model))
    result["cuda"] = doctor.cuda_report(cuda)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        width = max(len(check.id) for check in checks)
        for check in checks:
            print(f"{check.status.upper():4}  {check.id:<{width}}  {check.summary}")
        plan = result.get("plan")
        if isinstance(plan, dict):
            print("plan: " + ", ".join(f"{k}={v}" for k, v in plan.items()))
        print(f"status: {result['status']}")
    return 1 if result["status"] == "fail" else 0
