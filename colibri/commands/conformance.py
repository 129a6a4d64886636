"""``colibri conformance``: run the conformance suite against an engine or an HTTP server."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

#: The reference engine, run by this very interpreter.
DEFAULT_ENGINE = f"{shlex.quote(sys.executable)} -m colibri engine"


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--cases",
        action="append",
        default=[],
        metavar="GLOB",
        help="run only cases whose id or area matches (repeatable)",
    )
    parser.add_argument(
        "--case-file",
        action="append",
        default=[],
        type=Path,
        metavar="FILE",
        help="extra case file(s) besides the shipped ones",
    )
    parser.add_argument(
        "--capability",
        action="append",
        default=[],
        metavar="NAME",
        help="assume the target has this capability (repeatable)",
    )
    parser.add_argument(
        "--without",
        action="append",
        default=[],
        metavar="NAME",
        help="assume the target lacks this capability (repeatable)",
    )
    parser.add_argument(
        "--expectations",
        type=Path,
        metavar="FILE",
        help="per-target expectations (xfail / flaky / skip with reasons)",
    )
    parser.add_argument(
        "--update-expectations",
        action="store_true",
        help="write --expectations from this run's failures",
    )
    parser.add_argument(
        "--json", type=Path, dest="json_path", metavar="FILE", help="write one JSON record per case"
    )
    parser.add_argument(
        "--junit", type=Path, dest="junit_path", metavar="FILE", help="write JUnit XML"
    )
    parser.add_argument("--reruns", type=int, default=2, help="extra attempts for flaky cases")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="seconds to wait for any one expected answer"
    )
    parser.add_argument(
        "--list", action="store_true", dest="list_only", help="list the selected cases and exit"
    )
    parser.add_argument("-q", "--quiet", action="store_true", help="only print the summary")


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "conformance", help="run the conformance suite against an engine or a server"
    )
    suites = parser.add_subparsers(dest="suite", metavar="SUITE", required=True)

    protocol = suites.add_parser("protocol", help="engine wire protocol (stdin/stdout)")
    protocol.add_argument(
        "--engine-cmd",
        default=DEFAULT_ENGINE,
        help="engine command line; it gets SNAP, SERVE=1, SERVE_BATCH=1, KV_SLOTS, CTX, ... "
        "(default: the reference engine)",
    )
    protocol.add_argument("--model", type=Path, help="model directory (sent as SNAP)")
    protocol.add_argument(
        "--prompts",
        choices=("auto", "text", "ids"),
        default="auto",
        help="payload form: text, token ids (ids=1), or auto (ids without a tokenizer)",
    )
    protocol.add_argument(
        "--jobs",
        type=int,
        default=1,
        metavar="N",
        help="run cases on N engines side by side (default 1)",
    )
    protocol.add_argument(
        "--protocol-json", type=Path, help="grammar file (default: spec/protocol.json)"
    )
    _common(protocol)
    protocol.set_defaults(handler=run_protocol)

    http = suites.add_parser("http", help="HTTP surface (OpenAI / Anthropic compatible)")
    http.add_argument("--base-url", help="server to test, e.g. http://127.0.0.1:8000")
    http.add_argument(
        "--server-cmd",
        help="start this server command and test it "
        "(it gets --host/--port appended, or {port} replaced)",
    )
    http.add_argument("--model-id", help="model id the server serves (default: ask /v1/models)")
    http.add_argument("--api-key", help="API key the server expects")
    http.add_argument(
        "--profile",
        action="append",
        default=[],
        choices=("openai", "anthropic", "colibri"),
        help="run only the cases of this profile (repeatable): openai / anthropic (what their "
        "public API references document) or colibri (colibri's own surface)",
    )
    _common(http)
    http.set_defaults(handler=run_http)


def _options(args: argparse.Namespace) -> object:
    from colibri.conformance.session import RunOptions

    return RunOptions(
        select=args.cases,
        case_files=args.case_file,
        capabilities=args.capability,
        without=args.without,
        expectations=args.expectations,
        update_expectations=args.update_expectations,
        json_path=args.json_path,
        junit_path=args.junit_path,
        reruns=args.reruns,
        timeout=args.timeout,
        list_only=args.list_only,
        quiet=args.quiet,
        jobs=getattr(args, "jobs", 1),
        profiles=getattr(args, "profile", []),
    )


def run_protocol(args: argparse.Namespace) -> int:
    from colibri.conformance.engine import EngineError
    from colibri.conformance.grammar import GrammarError
    from colibri.conformance.protocol_target import protocol_runner
    from colibri.conformance.session import RunOptions, finish

    options = _options(args)
    assert isinstance(options, RunOptions)
    model = args.model.resolve() if args.model else None
    if model is None and args.engine_cmd == DEFAULT_ENGINE:
        # The reference engine serves the embedded default model; test exactly that one.
        from colibri.resources import default_model_dir

        model = default_model_dir()
    if model is not None and not model.is_dir():
        print(f"colibri conformance: --model {args.model} is not a directory", file=sys.stderr)
        return 2
    try:
        runner = protocol_runner(
            args.engine_cmd, model, args.prompts, args.protocol_json, args.timeout
        )
    except (EngineError, GrammarError) as exc:
        print(f"colibri conformance: {exc}", file=sys.stderr)
        return 2
    name = f"{args.engine_cmd} (model {model or 'default'})"
    return finish("protocol", runner, options, name)[0]


def run_http(args: argparse.Namespace) -> int:
    from colibri.conformance.http_runner import http_runner
    from colibri.conformance.http_target import HttpTargetError
    from colibri.conformance.session import RunOptions, finish

    options = _options(args)
    assert isinstance(options, RunOptions)
    if bool(args.base_url) == bool(args.server_cmd):
        print(
            "colibri conformance http: give exactly one of --base-url or --server-cmd",
            file=sys.stderr,
        )
        return 2
    try:
        runner = http_runner(
            args.base_url, args.server_cmd, args.model_id, args.api_key, args.timeout
        )
    except HttpTargetError as exc:
        print(f"colibri conformance: {exc}", file=sys.stderr)
        return 2
    return finish("http", runner, options, args.base_url or args.server_cmd)[0]
