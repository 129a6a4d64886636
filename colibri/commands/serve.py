"""``colibri serve``: the OpenAI + Anthropic HTTP server over an engine process."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from colibri.commands.engine import add_cluster_arguments
from colibri.commands.gpu_options import add_gpu_arguments, apply_gpu_arguments, gpu_error
from colibri.engine.registry import BACKENDS
from colibri.engine.settings import MIN_CTX, default_state_dir


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    return int(value) if value else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the OpenAI/Anthropic HTTP API over an engine",
        description="Serve the OpenAI- and Anthropic-compatible HTTP API (spec/http.md). "
                    "Without --model the embedded default model is served by the reference "
                    "engine on 127.0.0.1:8000.")
    add_arguments(parser)
    parser.set_defaults(handler=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The serve flags; `colibri web` takes the same ones."""
    parser.add_argument("--model", default=os.environ.get("COLI_MODEL"),
                        help="model directory (env COLI_MODEL; default: embedded model)")
    engine = parser.add_mutually_exclusive_group()
    engine.add_argument("--accelerated", action="store_true",
                        help="run `colibri engine --accelerated` (shorthand for --backend "
                             "accelerated)")
    engine.add_argument("--backend", choices=sorted(BACKENDS), default=None,
                        help="the backend `colibri engine` runs (default: reference)")
    engine.add_argument("--engine-cmd", default=os.environ.get("COLI_ENGINE_CMD"),
                        help="any conformant engine command line (env COLI_ENGINE_CMD)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address to listen on (default: 127.0.0.1, this machine only)")
    parser.add_argument("--port", type=int, default=8000, help="port (default: 8000)")
    parser.add_argument("--model-id", default=os.environ.get("COLI_MODEL_ID"),
                        help="the only accepted `model` (env COLI_MODEL_ID; default: the "
                             "embedded model's name, or with --model the family's id: "
                             "glm-5.2-colibri for GLM-5, olmoe-colibri for OLMoE)")
    parser.add_argument("--api-key", default=os.environ.get("COLI_API_KEY") or None,
                        help="require this bearer key on /v1 routes (env COLI_API_KEY; "
                             "default: none)")
    parser.add_argument("--kv-slots", type=int, default=_env_int("COLI_KV_SLOTS", 1),
                        help="conversations the engine keeps at once, each with its own KV "
                             "cache (env COLI_KV_SLOTS; default: 1)")
    parser.add_argument("--replicas", type=int, default=_env_int("COLI_REPLICAS", 1),
                        metavar="N",
                        help="run N engine replicas behind this one server, each with "
                             "--kv-slots slots; a conversation's turns go to the replica "
                             "holding its KV prefix, and --max-queue is shared (env "
                             "COLI_REPLICAS; default: 1)")
    parser.add_argument("--replica-cluster", default=os.environ.get("COLI_REPLICA_CLUSTER"),
                        metavar="ray[:ADDRESS]",
                        help="run the replicas' engines on the nodes of this running Ray "
                             "cluster (replica i on the i-th alive node) instead of as child "
                             "processes here; every node needs the model and colibri at the "
                             "same paths (env COLI_REPLICA_CLUSTER; default: here)")
    parser.add_argument("--ctx", type=int, default=None, metavar="TOKENS",
                        help="the engine's context in tokens, prompt and reply together (its "
                             "CTX; default: 4096, or the model's limit where smaller)")
    parser.add_argument("--ram-gb", type=float, default=None, metavar="GB",
                        help="bound everything the engine holds (dense weights, KV, expert "
                             "cache) to GB, for models bigger than RAM: experts that do not "
                             "fit are read from disk (the engine's RAM_GB; default: unbounded)")
    parser.add_argument("--max-queue", type=int, default=_env_int("COLI_MAX_QUEUE", 8),
                        help="requests that may wait for a slot before 429 (env "
                             "COLI_MAX_QUEUE; default: 8)")
    parser.add_argument("--queue-timeout", type=float,
                        default=_env_float("COLI_QUEUE_TIMEOUT", 300.0),
                        help="seconds a request may wait for a slot before 503 (env "
                             "COLI_QUEUE_TIMEOUT; default: 300)")
    parser.add_argument("--max-tokens", type=int, default=1024,
                        help="the largest max_tokens a request may ask for, and the default "
                             "(default: 1024)")
    parser.add_argument("--cors-origin", action="append", default=[],
                        help="exact origin to allow (repeat; '+origin' appends to defaults)")
    parser.add_argument("--allowed-host", action="append", default=[],
                        help="extra Host header to accept (repeat; env COLI_ALLOWED_HOSTS)")
    parser.add_argument("--auto-tier", action="store_true",
                        help="apply `colibri plan` to the engine: RAM_GB (the process's "
                        "budget), CTX, "
                        "the pin set of --usage (PIN, PIN_GB), never overriding variables "
                        "already set")
    parser.add_argument("--usage", type=Path, default=None, metavar="FILE",
                        help="with --auto-tier: a .coli_usage or STATS dump to pin the most "
                        "used experts from (default: $PIN when it names a file)")
    add_gpu_arguments(parser)
    add_cluster_arguments(parser)


def auto_tier(model_dir: Path, kv_slots: int, usage: Path | None, env: dict[str, str],
              host: Mapping[str, int] | None = None,
              devices: list[dict[str, Any]] | None = None) -> dict[str, str]:
    """The engine environment with the plan applied (colibri's `--auto-tier`); prints the
    `[PLAN]` line. Raises PlanError for a model or usage file the plan cannot read."""
    from colibri.plan import Request, auto_tier_usage, build, environment_for_plan

    plan = build(model_dir, Request(kv_slots=kv_slots, usage=auto_tier_usage(usage, env)),
                 host, devices)
    out = environment_for_plan(plan, env)
    ram = plan["tiers"]["ram"]
    where = "VRAM" if plan["tiers"]["vram"]["hot_experts"] else "CPU"
    pins = f" · pin {len(plan['pin']['experts'])}" if "pin" in plan else ""
    print(f"[PLAN] RAM {float(out['RAM_GB']):.1f} GB · cap "
          f"{ram['cache_slots_per_layer']}/layer · {where}{pins}", file=sys.stderr)
    return out


def served_tokenizer(model: str | None, engine_cmd: str | None) -> str | None:
    """The tokenizer.json of the model the engine serves, when this process knows it: an
    `--engine-cmd` without `--model` may serve any model, so its tokenizer is unknown."""
    from colibri import resources

    if model is None and engine_cmd:
        return None
    path = Path(model or resources.default_model_dir()) / "tokenizer.json"
    return str(path) if path.is_file() else None


def served_model_dir(model: str | None, engine_cmd: str | None) -> str | None:
    """The folder of the model the engine serves (its examples.json and shipped atlas), when
    this process knows it, as for :func:`served_tokenizer`."""
    from colibri import resources

    if model is None and engine_cmd:
        return None
    return str(Path(model or resources.default_model_dir()))


def served_model_id(model_id: str | None, model: str | None,
                    family_id: str = "glm-5.2-colibri") -> str:
    """An explicit id wins; the embedded default is served under its own name (it is not
    GLM-5.2: spec/DEVIATIONS.md "Served model id"); any other --model under its family's id
    (``family_id``: colibri's gateway serves a GLM-5 checkpoint as glm-5.2-colibri)."""
    if model_id:
        return model_id
    if model is None:
        from colibri import resources

        return resources.default_model_dir().name
    return family_id


def cors_origins(values: list[str]) -> tuple[str, ...]:
    from colibri.server.context import DEFAULT_CORS_ORIGINS

    plain = [v for v in values if not v.startswith("+")]
    extra = [v[1:] for v in values if v.startswith("+")]
    merged = (plain or list(DEFAULT_CORS_ORIGINS)) + extra
    return tuple(dict.fromkeys(merged))


def run(args: argparse.Namespace) -> int:
    import asyncio
    import logging

    from colibri import resources
    from colibri.server.chat_family import GLM, ChatFamilyError, family_for_model
    from colibri.server.context import ServerConfig
    from colibri.server.engine_client import EngineStartError
    from colibri.server.remote_replica import remote_replica_argv
    from colibri.server.runner import (
        ConfigError,
        EngineSpec,
        engine_argv,
        engine_env,
        serve_forever,
        validate,
    )

    served_dir = served_model_dir(args.model, args.engine_cmd)
    try:
        family = GLM if served_dir is None else family_for_model(Path(served_dir))
    except ChatFamilyError as exc:
        print(f"colibri serve: {exc}", file=sys.stderr)
        return 1
    allowed = list(args.allowed_host) + [
        h.strip() for h in os.environ.get("COLI_ALLOWED_HOSTS", "").split(",") if h.strip()]
    if "*" in allowed:
        print("colibri: warning: --allowed-host '*' disables the DNS-rebinding guard",
              file=sys.stderr)
    config = ServerConfig(
        model_id=served_model_id(args.model_id, args.model, family.model_id),
        api_key=args.api_key, family=family,
        max_tokens=args.max_tokens,
        kv_slots=args.kv_slots, replicas=args.replicas, max_queue=args.max_queue,
        queue_timeout=args.queue_timeout,
        cors_origins=cors_origins(args.cors_origin), allowed_hosts=tuple(allowed),
        bind_host=args.host, keepalive_s=float(os.environ.get("COLI_KEEPALIVE_S", "10")),
        think_default=os.environ.get("COLI_THINK") == "1",
        keepalive_text="." if os.environ.get("COLI_VISIBLE_KEEPALIVE") == "1" else "",
        web_dist=os.environ.get("COLI_WEB_DIST"),
        max_connections=int(os.environ.get("COLI_MAX_CONNECTIONS", "64")),
        max_connections_per_ip=int(os.environ.get("COLI_MAX_CONNECTIONS_PER_IP", "8")),
        read_deadline_s=float(os.environ.get("COLI_READ_DEADLINE", "30")),
        tokenizer_path=served_tokenizer(args.model, args.engine_cmd),
        model_dir=served_dir)
    try:
        validate(config, args.port)
    except ConfigError as exc:
        print(f"colibri serve: {exc}", file=sys.stderr)
        return 1
    # Tornado's access log: method, path, status and duration only; never a body.
    logging.basicConfig(level=logging.INFO, format="[%(name)s] %(message)s")
    model_dir = args.model or str(resources.default_model_dir())
    if args.replica_cluster:  # the engines start on other nodes, in other folders
        model_dir = str(Path(model_dir).resolve())
    spec = EngineSpec(model_dir, args.accelerated, args.engine_cmd, args.backend)
    env = engine_env(spec, config)
    ctx = getattr(args, "ctx", None)
    if ctx is not None:
        if ctx < MIN_CTX:
            print(f"colibri serve: --ctx must be at least {MIN_CTX}, got {ctx}", file=sys.stderr)
            return 1
        env["CTX"] = str(ctx)  # set before --auto-tier, which never overrides it
    ram_gb = getattr(args, "ram_gb", None)
    if ram_gb is not None:
        if ram_gb < 0:
            print(f"colibri serve: --ram-gb must be >= 0, got {ram_gb}", file=sys.stderr)
            return 1
        env["RAM_GB"] = repr(ram_gb)  # like --ctx, kept by --auto-tier
    problem = gpu_error(args.gpu, args.vram_gb)
    if problem is not None:
        print(f"colibri serve: {problem}", file=sys.stderr)
        return 1
    apply_gpu_arguments(args.gpu, args.vram_gb, env)  # the engine reads them from its env
    cluster = getattr(args, "cluster", None)
    cluster_workers = getattr(args, "cluster_workers", None)
    if cluster is not None:  # the engine reads them from its env, like RAM_GB
        env["COLI_CLUSTER"] = cluster
    if cluster_workers is not None:
        env["COLI_CLUSTER_WORKERS"] = str(cluster_workers)
    cluster_placement = getattr(args, "cluster_placement", None)
    if cluster_placement is not None:  # absolute: the engine may start in another folder
        env["COLI_CLUSTER_PLACEMENT"] = str(Path(cluster_placement).resolve())
    if args.replicas > 1 and not env.get("COLI_STATE_DIR"):
        # Named here so that each replica saves its KV slots in its own subfolder of it.
        env["COLI_STATE_DIR"] = str(default_state_dir(Path(model_dir), env))
    if getattr(args, "auto_tier", False):
        from colibri.plan import PlanError

        try:
            env = auto_tier(Path(model_dir), config.kv_slots, args.usage, env)
        except PlanError as exc:
            print(f"colibri serve: --auto-tier: {exc}", file=sys.stderr)
            return 1
    try:
        argv = engine_argv(spec, config.kv_slots)
        if args.replica_cluster:
            argv = remote_replica_argv(args.replica_cluster, argv)
        return asyncio.run(serve_forever(config, argv, env, args.port))
    except OSError as exc:
        print(f"colibri serve: cannot listen on {args.host}:{args.port}: {exc}",
              file=sys.stderr)
        return 1
    except EngineStartError as exc:
        print(f"colibri serve: {exc}", file=sys.stderr)
        return 1
