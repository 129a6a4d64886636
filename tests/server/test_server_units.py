"""Unit and property tests of the server's pure pieces: filters, parsers, template, admission."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from colibri.server.app import host_of
from colibri.server.context import ServerConfig, conversation_slot
from colibri.server.engine_client import EngineProcess, SubmitRequest, submit_header
from colibri.server.engine_events import Data, Done
from colibri.server.errors import APIError, ClientCancelled, context_exceeded
from colibri.server.metrics import GenerationMetrics, render
from colibri.server.pipeline import OutputPipeline, stop_filter
from colibri.server.runner import ConfigError, validate
from colibri.server.scheduler import Scheduler
from colibri.server.stops import GLM_IMPLICIT_STOPS, StopFilter
from colibri.server.template import render_chat
from colibri.server.thinking import ThinkingSplit
from colibri.server.toolcalls import ToolStreamGate, parse_strict, parse_tool_calls
from colibri.server.validation import ToolSpec, shaping
from hypothesis import given
from hypothesis import strategies as st

from colibri.commands.serve import cors_origins
from colibri.protocol import SPEC, FrameParser

# ---- stop filter ----------------------------------------------------------------------


def run_stops(chunks: list[str], sequences: tuple[str, ...], patient: bool) -> tuple[str, bool]:
    stops = StopFilter(sequences, patient)
    out = "".join(stops.feed(c) for c in chunks) + stops.finish()
    return out, stops.matched


@pytest.mark.parametrize(("chunks", "seqs", "patient", "want"), [
    (["answer S", "TO", "Pignored"], ("STOP",), False, "answer "),
    (["answer ST"], ("STOP",), False, "answer ST"),
    (["<|us", "er|>answer", "<|user|>ignored"], GLM_IMPLICIT_STOPS, True, "answer"),
    (["STOPuseful STOPdiscarded"], ("STOP",), True, "useful "),
    (["STOPignored"], ("STOP",), False, ""),
    (["Hé", "llo"], ("éll",), False, "H"),
])
def test_stop_filter_colibri_cases(chunks: list[str], seqs: tuple[str, ...], patient: bool,
                                   want: str) -> None:
    assert run_stops(chunks, seqs, patient)[0] == want


@given(st.text(alphabet="abST OP<|user>", max_size=40), st.lists(st.integers(0, 40),
                                                                  max_size=6),
       st.booleans())
def test_stop_filter_chunking_never_changes_the_output(text: str, cuts: list[int],
                                                       patient: bool) -> None:
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    seqs = ("STOP", "<|user|>")
    assert run_stops(chunks, seqs, patient) == run_stops([text], seqs, patient)


@given(st.text(alphabet="ab<|user>", max_size=30), st.integers(0, 30))
def test_stop_filter_output_never_contains_a_stop(text: str, cut: int) -> None:
    out, _ = run_stops([text[:cut], text[cut:]], ("<|user|>",), False)
    assert "<|user|>" not in out and text.startswith(out)


# ---- reasoning split ----------------------------------------------------------------


def run_split(chunks: list[str], thinking: bool) -> tuple[str, str]:
    split = ThinkingSplit(thinking)
    parts = [p for c in chunks for p in split.feed(c)] + split.finish()
    return ("".join(t for k, t, _ in parts if k == "reasoning"),
            "".join(t for k, t, _ in parts if k == "content"))


@pytest.mark.parametrize(("chunks", "thinking", "want"), [
    (["abc</think>def"], True, ("abc", "def")),
    (["abc</thi", "nk>def"], True, ("abc", "def")),
    (["abc<thi", "nk>def</think>ghi"], True, ("abcdef", "ghi")),
    (["abc</think>def"], False, ("", "abcdef")),
    (["no closing tag"], True, ("no closing tag", "")),
    (["I think ", "42", "</think>", "The answer ", "is 42"], True, ("I think 42",
                                                                    "The answer is 42")),
])
def test_thinking_split_colibri_cases(chunks: list[str], thinking: bool,
                                      want: tuple[str, str]) -> None:
    assert run_split(chunks, thinking) == want


@given(st.text(alphabet="ab</think>", max_size=40), st.integers(0, 40), st.booleans())
def test_thinking_split_is_chunking_invariant(text: str, cut: int, thinking: bool) -> None:
    assert run_split([text[:cut], text[cut:]], thinking) == run_split([text], thinking)


# ---- the answer mask (log-probabilities) ------------------------------------------------


@given(st.text(alphabet="ab S<|user>/think\n", max_size=50),
       st.lists(st.integers(0, 50), max_size=6), st.booleans(), st.booleans(),
       st.sampled_from([(), ("STOP",), ("ab",)]))
def test_the_answer_mask_selects_exactly_the_answer(text: str, cuts: list[int], chat: bool,
                                                    reasoning: bool,
                                                    stops: tuple[str, ...]) -> None:
    # Logprobs report the characters the pipeline marked; they must spell its answer, however
    # the engine text was chunked and wherever stops, markers and reasoning fell.
    points = sorted({min(c, len(text)) for c in cuts})
    chunks = [text[a:b] for a, b in zip([0, *points], [*points, len(text)], strict=True)]
    pipe = OutputPipeline(stop_filter(stops, False, chat),
                          ThinkingSplit(reasoning) if chat else None, False, False)
    for chunk in chunks:
        pipe.feed(chunk)
        if pipe.stopped:
            break
    pipe.finish()
    mask = pipe.answer_mask(len(text))
    assert "".join(c for c, keep in zip(text, mask, strict=True) if keep) == pipe.answer


# ---- tool calls ---------------------------------------------------------------------

WEATHER = ToolSpec(({"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
    "required": ["city"]}},), "auto", None)
ORDER = ToolSpec(({"name": "order", "parameters": {"type": "object", "properties": {
    "sku": {"type": "string"}, "qty": {"type": "integer"}, "express": {"type": "boolean"},
    "n": {"type": ["null", "number"]}}}},), "auto", None)


def call(name: str, **args: str) -> str:
    return f"<tool_call>{name}" + "".join(
        f"<arg_key>{k}</arg_key><arg_value>{v}</arg_value>" for k, v in args.items()
    ) + "</tool_call>"


def test_tool_arguments_are_typed_by_schema() -> None:
    content, calls = parse_tool_calls(call("order", sku="12345", qty="2", express="true",
                                           n="true", extra="7"), ORDER)
    assert content is None
    assert calls[0].arguments == {"sku": "12345", "qty": 2, "express": True, "n": "true",
                                  "extra": 7}
    assert json.loads(calls[0].openai()["function"]["arguments"])["sku"] == "12345"
    assert calls[0].openai()["function"]["arguments"].startswith('{"sku": "12345"')


def test_tool_content_around_calls() -> None:
    assert parse_tool_calls("Done." + call("get_weather", city="Rome"), WEATHER)[0] == "Done."
    text = "before " + call("get_weather", city="Rome") + " after"
    assert parse_tool_calls(text, WEATHER)[0] == "before  after"


@pytest.mark.parametrize("tail", ["", "<", "</", "</tool_cal"])
def test_unclosed_tail_recovery(tail: str) -> None:
    text = "ok <tool_call>get_weather<arg_key>city</arg_key><arg_value>Naples</arg_value>" + tail
    content, calls = parse_tool_calls(text, WEATHER)
    assert content == "ok" and calls[0].arguments == {"city": "Naples"}


def test_prose_mentioning_tool_call_is_not_a_call() -> None:
    content, calls = parse_tool_calls("I could emit <tool_call> here", WEATHER)
    assert calls == [] and content == "I could emit <tool_call> here"
    assert parse_tool_calls("<tool_call>get_weather", WEATHER)[1][0].name == "get_weather"
    assert parse_tool_calls("<tool_call>undeclared", WEATHER)[1] == []


@pytest.mark.parametrize(("text", "limited", "reason"), [
    (call("launch", x="1"), False, "undeclared function"),
    (call("get_weather", town="x"), False, "unknown, duplicate, or malformed argument"),
    (call("get_weather", city="a", days="soon"), False,
     "argument does not match its declared type"),
    (call("get_weather", days="2"), False, "missing required argument"),
    ("x <arg_key>", False, "incomplete or stray tool marker"),
    ("<tool_call>get_weather", True, None),
])
def test_strict_tool_calls_refuse(text: str, limited: bool, reason: str | None) -> None:
    with pytest.raises(APIError) as err:
        parse_strict(text, WEATHER, limited)
    assert err.value.status == 502 and err.value.code == "invalid_model_tool_call"
    if reason:
        assert err.value.message == f"Invalid GLM tool call: {reason}"


def test_stream_gate_holds_ten_characters_and_stops_at_a_call() -> None:
    gate = ToolStreamGate()
    assert gate.feed("Hello world, ") == "Hel"
    assert gate.feed("x<tool_call>get") == "lo world, x"
    assert gate.feed("more") == "" and gate.finish() == ""


# ---- template -------------------------------------------------------------------------


def test_glm_template_colibri_examples() -> None:
    messages: list[Any] = [
        {"role": "system", "content": "System"}, {"role": "developer", "content": "Developer"},
        {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
        {"role": "assistant", "content": " Hello "}, {"role": "user", "content": "Again"}]
    assert render_chat(messages, thinking=False, effort=None, tools=None,
                       continued=False).prompt == (
        "[gMASK]<sop><|system|>System<|system|>Developer<|user|>Hi<|assistant|><think></think>"
        "Hello<|user|>Again<|assistant|><think></think>")
    thinking = render_chat([{"role": "user", "content": "Hi"}], thinking=True, effort="high",
                           tools=None, continued=False)
    assert thinking.prompt == ("[gMASK]<sop><|system|>Reasoning Effort: High<|user|>Hi"
                               "<|assistant|><think>")
    assert thinking.starts_in_reasoning


@pytest.mark.parametrize(("effort", "word"), [("minimal", "Low"), ("low", "Low"),
                                              ("medium", "Medium"), ("high", "High"),
                                              ("xhigh", "Max"), ("none", "High")])
def test_effort_words(effort: str, word: str) -> None:
    prompt = render_chat([{"role": "user", "content": "x"}], thinking=True, effort=effort,
                         tools=None, continued=False).prompt
    assert f"Reasoning Effort: {word}<|user|>" in prompt


# ---- validation, admission, metrics, frames, config ------------------------------------


def test_shaping_defaults_and_clamp() -> None:
    result = shaping({}, 8)
    assert (result.max_tokens, result.temperature, result.top_p, result.stop) == (8, 0.7, 0.9,
                                                                                   ())
    assert shaping({"max_tokens": 100}, 8).max_tokens == 8
    assert shaping({"max_completion_tokens": 3, "max_tokens": 5}, 8).max_tokens == 3
    with pytest.raises(APIError) as err:
        shaping({"max_tokens": True}, 8)
    assert err.value.param == "max_tokens" and err.value.code is None


def test_submit_header_bytes() -> None:
    request = SubmitRequest(0, b"Complete me", 4, 0.0, 0.9)
    assert submit_header(1, request) == b"SUBMIT 1 0 11 4 0 0.9\n"
    with_ext = SubmitRequest(1, b"hello", 8, 0.7, 0.9, b"", {"logprobs": 2, "seed": 9})
    assert submit_header(5, with_ext) == b"SUBMIT 5 1 5 8 0.7 0.9 0 logprobs=2 seed=9\n"


def test_conversation_slot_is_stable_across_turns() -> None:
    first = [{"role": "system", "content": "s"}, {"role": "user", "content": "hello"}]
    later = [*first, {"role": "assistant", "content": "hi"}, {"role": "user", "content": "more"}]
    assert conversation_slot(first, 16) == conversation_slot(later, 16)
    assert conversation_slot(first, 1) == 0


def test_context_exceeded_message_forms() -> None:
    assert "maximum context length is 2046 tokens" in context_exceeded(("3000", "2046"),
                                                                       "messages").message
    qwen = context_exceeded(("prompt_tokens=9", "requested=4", "capacity=8"), "prompt")
    assert "is 8 tokens" in qwen.message and "at least 9 tokens" in qwen.message
    assert qwen.param == "prompt" and qwen.code == "context_length_exceeded"


def test_scheduler_reservations_and_rejections() -> None:
    async def scenario() -> list[Any]:
        sched = Scheduler(2, 1, 5.0, GenerationMetrics())
        never: Any = lambda: False  # noqa: E731
        first = await sched.acquire(0, never)
        second = await sched.acquire(None, never)  # slot 1 is free: no wait
        waiter = asyncio.ensure_future(sched.acquire(0, never))
        await asyncio.sleep(0)
        rejected = None
        try:
            await sched.acquire(None, never)
        except APIError as err:
            rejected = (err.status, err.code, err.headers)
        sched.release(first, "completed")
        third = await waiter
        gone = True
        cancelled = asyncio.ensure_future(sched.acquire(0, lambda: gone))
        try:
            await cancelled
        except ClientCancelled:
            pass
        sched.release(second, "failed")
        sched.release(third, "completed")
        return [first.slot, second.slot, third.slot, rejected, sched.snapshot()]

    slots = asyncio.run(scenario())
    assert slots[:3] == [0, 1, 0]
    assert slots[3] == (429, "queue_full", {"Retry-After": "1"})
    snap = slots[4]
    assert (snap["admitted"], snap["completed"], snap["failed"], snap["rejected"],
            snap["cancelled"], snap["active"]) == (3, 2, 1, 1, 1, 0)


def test_metrics_lines() -> None:
    from colibri.server.metrics import COUNTERS, GAUGES
    from prometheus_client.parser import text_string_to_metric_families

    metrics = GenerationMetrics()
    metrics.queue_wait.observe(0.25)
    metrics.queue_wait.observe(2.0)
    text = render({"active": 0, "queued": 0, "capacity": 1, "max_queue": 8, "admitted": 2,
                   "completed": 1, "failed": 0, "rejected": 7, "timed_out": 0,
                   "cancelled": 0}, metrics)
    # prometheus_client writes numbers as floats (spec/DEVIATIONS.md, "Metrics exposition")
    assert 'colibri_scheduler_queue_wait_seconds_bucket{le="0.5"} 1.0\n' in text
    assert 'colibri_scheduler_queue_wait_seconds_bucket{le="0.1"} 0.0\n' in text
    assert "colibri_scheduler_queue_wait_seconds_sum 2.25\n" in text
    assert "colibri_scheduler_rejected_total 7.0\n" in text
    assert text.endswith("colibri_scheduler_engine_call_seconds_count 0.0\n")
    assert "_created" not in text
    families = list(text_string_to_metric_families(text))
    names = [f.name for f in families]
    assert names == ["colibri_scheduler_" + k for k, _ in GAUGES + COUNTERS] + [
        "colibri_scheduler_" + n for n in ("queue_wait_seconds", "slot_duration_seconds",
                                           "first_output_seconds", "engine_call_seconds")]
    helps = {f.name: f.documentation for f in families}
    assert helps["colibri_scheduler_failed"] == "Admitted requests that raised an error."
    wait = next(f for f in families if f.name.endswith("queue_wait_seconds"))
    buckets = [(s.labels["le"], s.value) for s in wait.samples if s.name.endswith("_bucket")]
    assert [float(b) for b, _ in buckets[:-1]] == [0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30,
                                                   60, 300]
    assert buckets[-1] == ("+Inf", 2.0) and dict(buckets)["5.0"] == 2.0


def _read_by_the_client(wire: bytes) -> tuple[EngineProcess, list[Any]]:
    """What the engine client makes of some engine output: the events of request 4."""
    engine = EngineProcess(["engine"], {})
    queue: asyncio.Queue[Any] = asyncio.Queue()
    engine._queues[4] = queue
    for frame in FrameParser(seen_ready=True).feed(wire):
        engine._dispatch(frame)
    events = []
    while not queue.empty():
        events.append(queue.get_nowait())
    return engine, events


def test_frame_parsers() -> None:
    _, (data,) = _read_by_the_client(b"DATA 4 1 -0.5 2 7 -1.0 3 -0.5\nx\n")
    assert isinstance(data, Data) and data.record is not None
    assert data.record.candidates == ((7, -1.0), (3, -0.5)) and not data.malformed
    for bad in (b"DATA 4 1 -0.5 2 7 -1.0 7 -0.5\nx\n", b"DATA 4 1 -0.5 3 7 -1.0\nx\n"):
        _, (data,) = _read_by_the_client(bad)
        assert isinstance(data, Data) and data.malformed and data.record is None
    # Another family's DONE spells tok/s with three places: the server still reads it.
    _, (done,) = _read_by_the_client(b"DONE 4 STAT 3 1.250 50.0 1.25 7 1\n")
    assert isinstance(done, Done)
    assert done.stats.completion_tokens == 3 and done.stats.prompt_tokens == 7
    assert done.stats.length_limited and done.stats.tokens_per_second == 1.25
    engine, _ = _read_by_the_client(b"HWINFO 8 31.2 20.5 1 24.0 AMD Ryzen 9|CUDA device x1\n"
                                    b"CAPS seed=1 ids=0\n")
    assert engine.telemetry.hwinfo == {
        "cores": 8, "ram_total_gb": 31.2, "ram_avail_gb": 20.5, "gpus": 1,
        "vram_total_gb": 24.0, "cpu": "AMD Ryzen 9", "gpu": "CUDA device x1"}
    assert engine.telemetry.caps == {"seed": "1", "ids": "0"}
    assert "DATA" in SPEC.framed_kinds and "ECHO" in SPEC.framed_kinds


@pytest.mark.parametrize(("header", "host"), [
    ("127.0.0.1:8000", "127.0.0.1"), ("[::1]:8000", "::1"), ("::1", "::1"),
    ("Evil.Example.com", "evil.example.com"), ("", "")])
def test_host_parsing(header: str, host: str) -> None:
    assert host_of(header) == host


def test_cors_origin_flags() -> None:
    assert cors_origins(["https://a.example"]) == ("https://a.example",)
    merged = cors_origins(["+https://b.example"])
    assert merged[-1] == "https://b.example" and "http://localhost:5173" in merged


def test_config_refusals() -> None:
    validate(ServerConfig(), 8000)
    with pytest.raises(ConfigError, match="COLI_API_KEY"):
        validate(ServerConfig(bind_host="0.0.0.0"), 8000)
    validate(ServerConfig(bind_host="0.0.0.0", api_key="k"), 8000)
    for bad in (ServerConfig(kv_slots=0), ServerConfig(max_queue=-1),
                ServerConfig(queue_timeout=0), ServerConfig(max_tokens=0)):
        with pytest.raises(ConfigError):
            validate(bad, 8000)


# ---- admission invariants under random interleavings ---------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["acquire", "release", "cancel"]),
                         st.one_of(st.none(), st.integers(0, 2)),
                         st.sampled_from(["completed", "failed"])), max_size=30)


@given(OPS, st.integers(0, 3))
def test_scheduler_invariants(ops: list[tuple[str, int | None, str]], max_queue: int) -> None:
    async def scenario() -> None:
        sched = Scheduler(3, max_queue, 60.0, GenerationMetrics())
        held: list[Any] = []
        pending: list[tuple[asyncio.Future[Any], list[bool]]] = []
        for op, slot, outcome in ops:
            if op == "acquire":
                flag = [False]
                fut = asyncio.ensure_future(sched.acquire(slot, lambda f=flag: f[0]))
                pending.append((fut, flag))
            elif op == "release" and held:
                sched.release(held.pop(0), outcome)
            elif op == "cancel" and pending:
                pending[0][1][0] = True
            for _ in range(3):
                await asyncio.sleep(0)
            for fut, flag in list(pending):
                if fut.done():
                    pending.remove((fut, flag))
                    if fut.exception() is None:
                        held.append(fut.result())
            slots = [a.slot for a in held]
            assert len(slots) == len(set(slots)), "a slot was handed out twice"
            snap = sched.snapshot()
            assert snap["active"] == len(held)
            assert snap["queued"] <= max_queue
            assert snap["admitted"] == (snap["completed"] + snap["failed"] + snap["active"])
        sched.close()
        for fut, _ in pending:
            with pytest.raises((APIError, ClientCancelled)):
                await fut

    asyncio.run(scenario())


def test_engine_commands() -> None:
    from colibri.server.runner import EngineSpec, engine_argv, engine_env

    plain = engine_argv(EngineSpec("/m"), 2)
    assert plain[1:] == ["-m", "colibri", "engine", "--model", "/m", "--kv-slots", "2"]
    assert engine_argv(EngineSpec("/m", accelerated=True), 1)[-1] == "--accelerated"
    assert engine_argv(EngineSpec("/m", engine_cmd="./glm 0 'a b'"), 1) == ["./glm", "0",
                                                                            "a b"]
    env = engine_env(EngineSpec("/m"), ServerConfig(kv_slots=3, max_tokens=9))
    assert (env["SNAP"], env["SERVE"], env["SERVE_BATCH"], env["KV_SLOTS"], env["NGEN"]) == (
        "/m", "1", "1", "3", "9")


def test_fake_engine_speaks_the_protocol_grammar() -> None:
    """The scripted engine every server test uses must itself follow spec/protocol.json."""
    import subprocess
    import sys
    from pathlib import Path

    from colibri.protocol import parse_line

    fake = Path(__file__).parents[1] / "support" / "fake_engine.py"
    script = (b"SUBMIT 1 0 12 8 0 0.9 0 logprobs=2\nab @@noise@@\n"
              b"SUBMIT 2 1 3 8 0 0.9\nabc\nSUBMIT 3 2 10 2 0 0.9\nx @@long@@\n"
              b"SUBMIT 4 3 4 8 0 0.9\nx\x00yz\n")
    out = subprocess.run([sys.executable, str(fake)], input=script, capture_output=True,
                         timeout=30, check=True, env={"KV_SLOTS": "4"}).stdout
    lines = out.split(b"\n")
    kinds = []
    i = 0
    while i < len(lines):
        line = lines[i]
        i += 1
        if not line or line.startswith(b"==") or b"READY" in line:
            continue
        parsed = parse_line(line)
        kinds.append(parsed.kind if parsed else line.split()[0].decode())
        if kinds[-1] in SPEC.framed_kinds:
            i += 1  # the payload line
    assert kinds.count("DONE") == 3 and "FUTURE_KIND" in kinds and "ECHO" in kinds
    assert "ERROR" in kinds and "TOPK" in kinds and "PROF" in kinds


def test_tool_salvage_is_opt_in(monkeypatch: pytest.MonkeyPatch) -> None:
    text = "<tool_call>get_weather(\"Rome\")</tool_call>"
    # Without salvage the call's text is not argument tags: reported, not called with {}.
    assert parse_tool_calls(text, WEATHER) == (text, [])
    monkeypatch.setenv("COLI_TOOL_SALVAGE", "1")
    assert parse_tool_calls(text, WEATHER)[1][0].arguments == {"city": "Rome"}
    bare = ToolSpec(({"name": "ping"},), "auto", None)
    assert parse_tool_calls("<tool_call>ping {\"a\": 1}</tool_call>", bare)[1][0].arguments == {
        "input": {"a": 1}}
