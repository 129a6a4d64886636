"""Operational behaviour of `colibri serve`: official SDKs, admission under load, engine
death and restart, cancellation, keepalives, seeds, metrics, the OpenAPI document."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from colibri.server.context import ServerConfig
from support.http_transcript import exchange, parse_sse, validate
from support.server_harness import LiveServer, launch

from colibri import resources

# The official SDKs are imported inside the tests that use them: their pydantic types take
# seconds to import, and every pytest worker imports every test module when it collects.

M = "test-model"


def wait_for(predicate: Callable[[], bool], what: str, limit_s: float = 20.0) -> None:
    """Poll until the server reaches a state; the bound only turns a hang into a failure."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"server never reached: {what}")
        time.sleep(0.02)


def health(server: LiveServer) -> dict[str, Any]:
    body: dict[str, Any] = exchange(server.url, "GET", "/health")["body"]
    return body


@pytest.fixture(scope="module")
def server() -> Iterator[LiveServer]:
    live = launch(ServerConfig(model_id=M, api_key="k", max_tokens=64))
    yield live
    live.stop()


# ---- official SDKs ------------------------------------------------------------------

def test_openai_sdk_chat_plain_and_stream(server: LiveServer) -> None:
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    reply = client.chat.completions.create(model=M, messages=[{"role": "user",
                                                               "content": "hi"}])
    assert reply.choices[0].message.content == "Héllo"
    assert reply.usage is not None and reply.usage.completion_tokens == 2
    stream = client.chat.completions.create(
        model=M, messages=[{"role": "user", "content": "hi"}], stream=True,
        stream_options={"include_usage": True})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "Héllo"
    assert [c.usage.total_tokens for c in chunks if c.usage] != []
    # The colibri stats frame is a chunk with no choices that the SDK parses unharmed.
    assert any(not c.choices and getattr(c, "colibri", None) for c in chunks)


def test_openai_sdk_completions_and_errors(server: LiveServer) -> None:
    import openai
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="k", max_retries=0)
    done = client.completions.create(model=M, prompt="Complete me", max_tokens=4)
    assert done.choices[0].text == "Héllo"
    streamed = client.completions.create(model=M, prompt="x", stream=True)
    assert "".join(c.choices[0].text for c in streamed if c.choices) == "Héllo"
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model=M, messages=[], max_tokens=3)
    # spec/http.md error table: an empty `messages` names the param, with a null code.
    assert bad.value.code is None and bad.value.param == "messages"
    assert bad.value.body == {"message": "`messages` must be a non-empty array.",
                              "type": "invalid_request_error", "param": "messages", "code": None}
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=[{"role": "user",
                                                                "content": "x"}])
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    assert [m.id for m in client.models.list()] == [M]


def test_anthropic_sdk_messages(server: LiveServer) -> None:
    import anthropic
    client = anthropic.Anthropic(base_url=server.url, api_key="k", max_retries=0)
    message = client.messages.create(model=M, max_tokens=16,
                                     messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].type == "text" and message.content[0].text == "Héllo"
    assert message.stop_reason == "end_turn"
    with client.messages.stream(model=M, max_tokens=16,
                                messages=[{"role": "user", "content": "hi"}]) as stream:
        assert "".join(stream.text_stream) == "Héllo"
        final = stream.get_final_message()
    assert final.usage.output_tokens == 2
    tool = client.messages.create(
        model=M, max_tokens=16, messages=[{"role": "user", "content": "@@rome@@"}],
        tools=[{"name": "get_weather", "input_schema": {
            "type": "object", "properties": {"city": {"type": "string"}}}}])
    assert tool.stop_reason == "tool_use"
    assert tool.content[0].type == "tool_use" and tool.content[0].input == {"city": "Rome"}
    with pytest.raises(anthropic.BadRequestError):
        client.messages.create(model=M, max_tokens=4, extra_body={"top_k": 3},
                               messages=[{"role": "user", "content": "x"}])
    with pytest.raises(anthropic.AuthenticationError):
        anthropic.Anthropic(base_url=server.url, api_key="no", max_retries=0).messages.create(
            model=M, max_tokens=4, messages=[{"role": "user", "content": "x"}])


# ---- admission under load -------------------------------------------------------------

def test_loopback_load_exact_rejections_and_counters(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    live = launch(ServerConfig(model_id=M, kv_slots=1, max_queue=2, max_tokens=64,
                               max_connections_per_ip=32), env={"FAKE_GATE": str(gate)})
    try:
        def post(content: str) -> int:
            return int(exchange(live.url, "POST", "/v1/chat/completions",
                                {"model": M, "messages": [{"role": "user",
                                                           "content": content}]})["status"])

        pool = concurrent.futures.ThreadPoolExecutor(12)
        holder = pool.submit(post, "@@gate@@")
        wait_for(lambda: health(live)["scheduler"]["active"] == 1, "holder admitted")
        fillers = []
        for n in range(2):
            fillers.append(pool.submit(post, "@@hold:1@@"))
            wait_for(lambda n=n: health(live)["scheduler"]["queued"] == n + 1, "queued")
        extra = [pool.submit(post, "x") for _ in range(7)]
        extra_status = [f.result(30) for f in extra]
        assert extra_status == [429] * 7
        Path(f"{gate}.0").touch()  # let the holder finish
        assert holder.result(30) == 200 and [f.result(30) for f in fillers] == [200, 200]
        pool.shutdown()
        snap = health(live)["scheduler"]
        assert snap["rejected"] == 7 and snap["active"] == 0 and snap["queued"] == 0
        assert snap["admitted"] == snap["completed"] + snap["failed"] + snap["cancelled"] == 3
        metrics = exchange(live.url, "GET", "/metrics")["text"]
        assert "colibri_scheduler_rejected_total 7.0\n" in metrics
        assert "colibri_scheduler_admitted_total 3.0\n" in metrics
        assert 'colibri_scheduler_queue_wait_seconds_bucket{le="+Inf"} 3.0\n' in metrics
    finally:
        live.stop()


def test_queue_full_response_shape(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    live = launch(ServerConfig(model_id=M, kv_slots=1, max_queue=0, max_tokens=64),
                  env={"FAKE_GATE": str(gate)})
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            holder = pool.submit(exchange, live.url, "POST", "/v1/chat/completions",
                                 {"model": M, "messages": [{"role": "user",
                                                            "content": "@@gate@@"}]})
            wait_for(lambda: health(live)["scheduler"]["active"] == 1, "holder admitted")
            refused = exchange(live.url, "POST", "/v1/messages", {
                "model": M, "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]})
            Path(f"{gate}.0").touch()
            assert holder.result(30)["status"] == 200
        assert refused["status"] == 429
        assert refused["headers"]["retry-after"] == "1"
        assert refused["body"] == {"type": "error", "error": {
            "type": "rate_limit_error", "message": "The inference queue is full."}}
    finally:
        live.stop()


# ---- engine death, cancellation, keepalives ------------------------------------------

def test_engine_killed_mid_stream_is_survived() -> None:
    live = launch(ServerConfig(model_id=M, max_tokens=64))
    try:
        stream = exchange(live.url, "POST", "/v1/chat/completions", {
            "model": M, "stream": True, "messages": [{"role": "user", "content": "@@die@@"}]})
        assert stream["status"] == 200
        assert "[DONE]" not in stream["events"]  # the stream was closed, not finished
        wait_for(lambda: health(live)["engine"]["restarts"] == 1
                 and health(live)["status"] == "ok", "engine restarted")
        early = exchange(live.url, "POST", "/v1/chat/completions", {
            "model": M, "messages": [{"role": "user", "content": "@@dieearly@@"}]})
        assert early["status"] == 500 and early["body"]["error"]["code"] == "engine_error"
        wait_for(lambda: health(live)["engine"]["restarts"] == 2
                 and health(live)["status"] == "ok", "engine restarted again")
        after = exchange(live.url, "POST", "/v1/chat/completions", {
            "model": M, "messages": [{"role": "user", "content": "hi"}]})
        assert after["status"] == 200
        assert after["body"]["choices"][0]["message"]["content"] == "Héllo"
        snap = health(live)
        assert snap["scheduler"]["failed"] == 2 and snap["scheduler"]["completed"] == 1
        assert snap["engine"]["last_exit"] is not None
    finally:
        live.stop()


def test_client_disconnect_cancels_generation(tmp_path: Path) -> None:
    live = launch(ServerConfig(model_id=M, max_tokens=64),
                  env={"FAKE_GATE": str(tmp_path / "gate")})
    try:
        body = json.dumps({"model": M, "stream": True, "messages": [
            {"role": "user", "content": "@@gate@@"}]}).encode()
        sock = socket.create_connection(("127.0.0.1", live.server.port))
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: "
                     + str(len(body)).encode() + b"\r\n\r\n" + body)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.close()
        wait_for(lambda: health(live)["scheduler"]["cancelled"] == 1, "cancellation")
        snap = health(live)["scheduler"]
        assert snap["active"] == 0 and snap["admitted"] == 1 and snap["completed"] == 0
        follow = exchange(live.url, "POST", "/v1/chat/completions", {
            "model": M, "messages": [{"role": "user", "content": "hi"}]})
        assert follow["status"] == 200
    finally:
        live.stop()


def test_keepalives_during_slow_prefill() -> None:
    live = launch(ServerConfig(model_id=M, max_tokens=64, keepalive_s=0.1))
    try:
        chat = exchange(live.url, "POST", "/v1/chat/completions", {
            "model": M, "stream": True, "messages": [{"role": "user",
                                                      "content": "@@prefill:6@@"}]})
        keepalive = {"index": 0, "delta": {"reasoning_content": ""}, "logprobs": None,
                     "finish_reason": None}
        assert any(e != "[DONE]" and e["choices"] == [keepalive] for e in chat["events"])
        msgs = exchange(live.url, "POST", "/v1/messages", {
            "model": M, "max_tokens": 8, "stream": True,
            "messages": [{"role": "user", "content": "@@prefill:6@@"}]})
        assert {"event": "ping", "data": {"type": "ping"}} in msgs["events"]
    finally:
        live.stop()


def test_seed_travels_only_when_announced() -> None:
    live = launch(ServerConfig(model_id=M, max_tokens=64), env={"FAKE_CAPS": "seed=1"})
    try:
        reply = exchange(live.url, "POST", "/v1/chat/completions", {
            "model": M, "seed": 42, "messages": [{"role": "user", "content": "@@seed@@"}]})
        assert reply["body"]["choices"][0]["message"]["content"] == "seed=42"
        assert health(live)["engine"]["seeds"] is True
    finally:
        live.stop()


# ---- spec, metrics, static --------------------------------------------------------

def test_openapi_served_and_generated_files_current(server: LiveServer) -> None:
    import subprocess
    import sys

    served = exchange(server.url, "GET", "/openapi.json")["body"]
    assert served == json.loads(resources.spec_path("openapi.yaml").read_text())
    assert served["openapi"] == "3.1.0" and "/v1/messages" in served["paths"]
    tool = resources.spec_dir().parent / "tools" / "make_http_spec.py"
    if tool.exists():
        assert subprocess.run([sys.executable, str(tool), "--check"]).returncode == 0


def test_metrics_exposition(server: LiveServer) -> None:
    assert exchange(server.url, "GET", "/metrics")["status"] == 401
    conn = http.client.HTTPConnection("127.0.0.1", server.server.port)
    conn.request("GET", "/metrics", headers={"x-api-key": "k"})
    response = conn.getresponse()
    text = response.read().decode()
    assert response.getheader("Content-Type") == "text/plain; version=0.0.4; charset=utf-8"
    assert "# HELP colibri_scheduler_failed_total Admitted requests that raised an error.\n" in text
    for name in ("queue_wait", "slot_duration", "first_output", "engine_call"):
        assert f'colibri_scheduler_{name}_seconds_bucket{{le="1.0"}}' in text
        assert f'colibri_scheduler_{name}_seconds_bucket{{le="0.001"}}' in text
    assert "Héllo" not in text and "@@rome@@" not in text and "Complete me" not in text


def test_health_and_experts_when_authenticated(server: LiveServer) -> None:
    full = exchange(server.url, "GET", "/health", headers={"x-api-key": "k"})["body"]
    validate("health", full)
    assert list(full["scheduler"]) == ["active", "queued", "capacity", "max_queue",
                                       "queue_timeout_seconds", "admitted", "completed",
                                       "failed", "rejected", "timed_out", "cancelled"]
    assert full["hwinfo"]["cpu"] == "Fake CPU"
    experts = exchange(server.url, "GET", "/experts", headers={"x-api-key": "k"})["body"]
    assert experts["rows"] == 2 and experts["cols"] == 4 and experts["seq"] >= 0
    profile = exchange(server.url, "GET", "/profile", headers={"x-api-key": "k"})["body"]
    validate("profile", profile)


def test_web_not_built_is_a_clear_404(tmp_path: Any) -> None:
    live = launch(ServerConfig(model_id=M, web_dist=str(tmp_path / "missing")))
    try:
        page = exchange(live.url, "GET", "/")
        assert page["status"] == 404 and page["body"]["error"]["code"] == "web_not_built"
    finally:
        live.stop()


def test_sse_parser_reads_named_events() -> None:
    assert parse_sse('event: ping\ndata: {"type":"ping"}\n\ndata: [DONE]\n\n') == [
        {"event": "ping", "data": {"type": "ping"}}, "[DONE]"]


def test_chat_attach_streams_a_conversation(server: LiveServer) -> None:
    import argparse
    import io

    from colibri.server import attach

    parser = argparse.ArgumentParser()
    attach.add_arguments(parser)
    args = parser.parse_args(["--attach", server.url, "--api-key", "k"])
    out = io.StringIO()
    assert attach.run(args, io.StringIO("hi\nagain\n\n"), out) == 0
    assert out.getvalue() == "Héllo\nHéllo\n"


def test_unknown_lines_ignored_and_turn_telemetry_kept(server: LiveServer) -> None:
    reply = exchange(server.url, "POST", "/v1/chat/completions", {
        "model": M, "messages": [{"role": "user", "content": "@@noise@@"}]},
        headers={"x-api-key": "k"})["body"]
    assert reply["choices"][0]["message"]["content"] == "Héllo"
    stats = reply["colibri"]
    assert stats["repin"] == [{"layer": 1, "expert": 2, "old_tier": 0, "gpu": 0}]
    assert stats["entropy"] == [1.5, 2.5]
    assert stats["gpus"] == [{"used_gb": 1.5, "total_gb": 24.0, "experts": 7}]
    assert stats["perf"]["forwards"] == 3 and stats["stats"]["completion_tokens"] == 2


def test_queue_timeout_cancel_while_queued_and_shutdown(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    live = launch(ServerConfig(model_id=M, kv_slots=1, max_queue=4, queue_timeout=0.3,
                               max_tokens=64), env={"FAKE_GATE": str(gate)})
    stopped = False
    try:
        def post(content: str) -> dict[str, Any]:
            return exchange(live.url, "POST", "/v1/chat/completions", {
                "model": M, "messages": [{"role": "user", "content": content}]})

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            holder = pool.submit(post, "@@gate:1@@")
            wait_for(lambda: health(live)["scheduler"]["active"] == 1, "holder admitted")
            late = post("x")
            assert late["status"] == 429 and late["headers"]["retry-after"] == "1"
            assert late["body"]["error"]["code"] == "queue_timeout"
            # A queued client that hangs up is cancelled without being admitted.
            body = json.dumps({"model": M, "messages": [{"role": "user", "content": "y"}]})
            sock = socket.create_connection(("127.0.0.1", live.server.port))
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
                         + body.encode())
            wait_for(lambda: health(live)["scheduler"]["queued"] == 1, "queued")
            sock.close()
            wait_for(lambda: health(live)["scheduler"]["cancelled"] == 1, "queued cancel")
            snap = health(live)["scheduler"]
            assert snap["timed_out"] == 1 and snap["admitted"] == 1 and snap["queued"] == 0
            Path(f"{gate}.1").touch()
            assert holder.result(30)["status"] == 200
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            holder = pool.submit(post, "@@gate:2@@")
            wait_for(lambda: health(live)["scheduler"]["active"] == 1, "holder admitted")
            live.state.scheduler.queue_timeout = 60.0
            waiter = pool.submit(post, "z")
            wait_for(lambda: health(live)["scheduler"]["queued"] == 1, "waiter queued")
            live.state.scheduler.close()
            closed = waiter.result(30)
            assert closed["status"] == 503
            assert closed["body"]["error"]["code"] == "scheduler_closed"
            Path(f"{gate}.2").touch()
            holder.result(30)
            live.stop()
            stopped = True
    finally:
        if not stopped:
            live.stop()


def test_prompts_never_reach_logs(server: LiveServer, caplog: pytest.LogCaptureFixture,
                                  capfd: pytest.CaptureFixture[str]) -> None:
    import logging

    secret = "SECRET-PROMPT-7f3a"
    with caplog.at_level(logging.DEBUG):
        for path, body in (("/v1/chat/completions", {"model": M, "messages": [
                {"role": "user", "content": secret + " @@fault@@"}]}),
                ("/v1/completions", {"model": M, "prompt": secret, "max_tokens": 2}),
                ("/v1/messages", {"model": M, "max_tokens": 2, "messages": [
                    {"role": "user", "content": secret}]})):
            exchange(server.url, "POST", path, body, headers={"x-api-key": "k"})
    captured = capfd.readouterr()
    assert secret not in caplog.text
    assert secret not in captured.err and secret not in captured.out
    metrics = exchange(server.url, "GET", "/metrics", headers={"x-api-key": "k"})["text"]
    assert secret not in metrics


def test_concurrent_streams_are_demultiplexed_by_id() -> None:
    live = launch(ServerConfig(model_id=M, kv_slots=2, max_tokens=64))
    try:
        def stream(slot: int, directive: str) -> str:
            events = exchange(live.url, "POST", "/v1/chat/completions", {
                "model": M, "stream": True, "cache_slot": slot,
                "messages": [{"role": "user", "content": directive}]})["events"]
            return "".join(e["choices"][0]["delta"].get("content", "") for e in events
                           if e != "[DONE]" and e["choices"])

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            first = pool.submit(stream, 0, "@@hold:2@@")
            second = pool.submit(stream, 1, "@@multi@@")
            assert first.result(30) == "Héllo world" * 4
            assert second.result(30) == "Hello world, this is a longer reply."
        assert health(live)["scheduler"]["completed"] == 2
    finally:
        live.stop()
