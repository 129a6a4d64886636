"""Bench section ``server-stream``: tokens/s streamed through ``colibri serve`` against the
same engine driven alone, in one run.

The same engine command serves the same prompt twice per round: once driven directly over
its stdin/stdout protocol, once through ``colibri serve`` as an SSE stream of
``/v1/completions``. Rounds alternate so drift on the machine hits both sides alike. Decode
throughput counts tokens between the first and the last token (what the streaming path
adds per token); end-to-end throughput divides all tokens by the time from request to end.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from colibri.benchmarks import BenchOptions, Section, register
from colibri.benchmarks.sse_client import stream_chunks
from colibri.protocol import SubmitRequest
from colibri.server.context import ServerConfig
from colibri.server.engine_client import Accept, Data, Done, EngineProcess
from colibri.server.runner import RunningServer, start
from colibri.text.chat_format import chat_prompt

PROMPT = chat_prompt("Tell me a story about a hummingbird.")


def _rates(times: list[float], start_s: float, end_s: float, tokens: int) -> tuple[float,
                                                                                   float]:
    decode = (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 and (
        times[-1] > times[0]) else 0.0
    return decode, tokens / (end_s - start_s)


async def _engine_round(engine: EngineProcess, tokens: int) -> tuple[float, float, int]:
    request = SubmitRequest(0, PROMPT.encode(), tokens, 0.0, 0.9)
    began = time.perf_counter()
    request_id, queue = await engine.submit(request)
    times: list[float] = []
    while True:
        event = await queue.get()
        if isinstance(event, Data):
            times.append(time.perf_counter())
        elif isinstance(event, Accept):
            continue
        elif isinstance(event, Done):
            ended = time.perf_counter()
            count = event.stats.completion_tokens
            break
        else:
            raise RuntimeError(f"engine answered {event!r}")
    engine.release(request_id)
    decode, overall = _rates(times, began, ended, count)
    return decode, overall, count


def _server_round(port: int, model_id: str, tokens: int) -> tuple[float, float, int]:
    payload = {"model": model_id, "prompt": PROMPT, "max_tokens": tokens, "temperature": 0,
               "stream": True}
    began = time.perf_counter()
    times: list[float] = []
    count = 0
    for chunk in stream_chunks(port, "/v1/completions", payload):
        if chunk["choices"] and chunk["choices"][0]["text"]:
            times.append(time.perf_counter())
        if "colibri" in chunk:
            count = int(chunk["colibri"]["stats"]["completion_tokens"])
    ended = time.perf_counter()
    decode, overall = _rates(times, began, ended, count)
    return decode, overall, count


def measure(engine_argv: Sequence[str], env: dict[str, str], *, tokens: int = 32,
            rounds: int = 3, warmup: int = 1) -> dict[str, Any]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def call(coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, loop).result(3600)

    config = ServerConfig(model_id="bench", max_tokens=max(tokens, 1))
    engine = EngineProcess(engine_argv, env)
    call(engine.start())
    server: RunningServer = call(start(config, engine_argv, env, 0))
    engine_rates: list[tuple[float, float, int]] = []
    server_rates: list[tuple[float, float, int]] = []
    try:
        for index in range(warmup + rounds):
            alone = call(_engine_round(engine, tokens))
            served = _server_round(server.port, config.model_id, tokens)
            if index >= warmup:
                engine_rates.append(alone)
                server_rates.append(served)
    finally:
        call(server.stop(10.0))
        call(engine.close(10.0))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)

    def summary(rates: list[tuple[float, float, int]]) -> dict[str, Any]:
        return {"decode_tok_s": round(statistics.median(r[0] for r in rates), 2),
                "end_to_end_tok_s": round(statistics.median(r[1] for r in rates), 2),
                "completion_tokens": rates[-1][2]}

    alone_summary, served_summary = summary(engine_rates), summary(server_rates)
    ratio = (served_summary["decode_tok_s"] / alone_summary["decode_tok_s"]
             if alone_summary["decode_tok_s"] else 0.0)
    e2e = (served_summary["end_to_end_tok_s"] / alone_summary["end_to_end_tok_s"]
           if alone_summary["end_to_end_tok_s"] else 0.0)
    return {"engine": " ".join(engine_argv), "tokens": tokens, "rounds": rounds,
            "engine_alone": alone_summary, "through_server": served_summary,
            "ratio_decode": round(ratio, 3), "ratio_end_to_end": round(e2e, 3),
            "target_ratio": 0.95, "meets_target": ratio >= 0.95}


def run(options: BenchOptions) -> dict[str, Any]:
    from colibri import resources

    model = options.model
    if model is None or not (model / "tokenizer.json").exists():
        # The HTTP path sends text: it needs a model with a tokenizer.
        model = resources.default_model_dir()
    argv = [sys.executable, "-m", "colibri", "engine", "--model", str(model)]
    return measure(argv, dict(os.environ), tokens=max(options.tokens, 2),
                   warmup=max(1, options.warmup // 4))


register(Section(
    name="server-stream", engines=("reference", "server"),
    description="tokens/s streamed through colibri serve vs the same engine driven alone, "
                "in one run", run=run))
