"""``colibri doctor``: report what this installation can do; non-zero exit when broken."""

from __future__ import annotations

import argparse
import json


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "doctor", help="check the installation (versions, package data, engines, GPU)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from colibri import doctor

    checks = doctor.run_checks()
    result = doctor.report(checks)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        width = max(len(check.id) for check in checks)
        for check in checks:
            print(f"{check.status.upper():4}  {check.id:<{width}}  {check.summary}")
        print(f"status: {result['status']}")
    return 1 if result["status"] == "fail" else 0
