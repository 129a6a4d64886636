"""Building the protocol executor for an engine command and a model directory."""

from __future__ import annotations

from pathlib import Path

from colibri.conformance.engine import (
    EngineError,
    EngineTarget,
    probe_capabilities,
    probe_legacy,
)
from colibri.conformance.grammar import load_grammar
from colibri.conformance.prompts import PromptCodec
from colibri.conformance.protocol_runner import ProtocolRunner

from colibri.resources import spec_dir


def protocol_runner(
    engine_cmd: str,
    model_dir: Path | None,
    prompts: str = "auto",
    protocol_json: Path | None = None,
    timeout: float = 30.0,
    env: dict[str, str] | None = None,
    capabilities: set[str] | None = None,
) -> ProtocolRunner:
    """Probe the engine's handshake for capabilities and ready a runner.

    Capabilities come from three places: the handshake's capability line, the model (a
    tokenizer means text prompts, an oracle.json means golden cases) and the always-present
    core of the mux protocol.
    """
    target = EngineTarget.from_command(engine_cmd, model_dir, env)
    grammar = load_grammar(protocol_json or spec_dir() / "protocol.json")
    codec = PromptCodec.for_model(model_dir, prompts)
    if capabilities is not None:
        # The caller already knows (a previous probe of the same engine): skip the probes.
        return ProtocolRunner(target, codec, grammar, set(capabilities), timeout)
    try:
        announced, _ = probe_capabilities(target, timeout)
    except EngineError as exc:
        raise EngineError(f"engine handshake failed: {exc}") from exc
    # ACCEPT, STOP, CONTEXT_EXCEEDED and .coli_kv persistence are in every current colibri
    # engine; an engine without them is tested with --without NAME (or expectations).
    capabilities = {"mux", "accept", "stop", "context_exceeded", "persistence"} | announced
    if probe_legacy(target, min(timeout, 10.0)):
        capabilities.add("legacy_protocol")
    if not codec.ids_mode:
        capabilities.add("text_prompts")
    if codec.oracle:
        capabilities.add("oracle")
    return ProtocolRunner(target, codec, grammar, capabilities, timeout)
