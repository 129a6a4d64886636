"""Protocol profiles: which capabilities are the seed's `core`, which are named extensions.

`core` is the mux protocol of the seed document (``serve_protocol.md``: SUBMIT with six
fields, CANCEL, DATA, TOPK with ``SERVE_TOPK=1``, HITS, PERF and the turn-end telemetry,
DONE, the seed's error codes, EOF shutdown, prefix reuse, the legacy protocol). Every
colibri-protocol engine must pass it. Everything beyond it is a capability a case
`requires`, grouped into the `colibri` profile (what the newest colibri engine and this
project's ``colibri engine`` do). `serve_codec` is a sibling of `core`, not an extension of
it: the dialect of colibri's family engines, which read and write frames through the shared
codec ``c/serve_codec.h`` (spec/protocol.md §5); what its cases require is its own
capabilities, and a target that speaks it says so in its target description. spec/conformance.md
defines the three; this module is the one place the suite reads them from.

A capability is known in one of three ways (:func:`known_capabilities`): a ``CAPS`` line
(this project's handshake extension: ``proto=1`` stands for protocol.md revision 1, whose
unkeyed extensions come with it; keyed ones only when announced), a safe probe (ACCEPT, STOP
and PROF are observed in a throwaway engine), or the target description's declaration.
Never by assumption.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CORE = "core"
COLIBRI = "colibri"
SERVE_CODEC = "serve_codec"
#: The capability that says a target speaks the serve_codec dialect: the runner then frames
#: SUBMITs the codec's way (keys right after top_p, no gbytes).
CODEC_WIRE = "codec_wire"


@dataclass(frozen=True)
class Capability:
    name: str
    profile: str
    #: Who added it: "seed", "colibri" (newer colibri engines), "project" (this repository),
    #: or "target" (a fact of the model or harness, not of the protocol).
    origin: str
    #: The spec text that defines it.
    clause: str
    summary: str


_ALL = (
    # The seed's own protocol: assumed, because every colibri-protocol engine speaks it.
    Capability("mux", CORE, "seed", "serve_protocol.md (mux)", "the mux protocol"),
    Capability("topk_frames", CORE, "seed", "serve_protocol.md (TOPK)",
               "TOPK frames with SERVE_TOPK=1"),
    Capability("legacy_protocol", CORE, "seed", "serve_protocol.md (Legacy protocol)",
               "the legacy protocol (SERVE=1 without SERVE_BATCH)"),
    # Extensions newer colibri engines added.
    Capability("accept", COLIBRI, "colibri", "protocol.md §2.5",
               "every accepted SUBMIT is answered ACCEPT <id> <nt>"),
    Capability("stop", COLIBRI, "colibri", "protocol.md §2.2",
               "STOP <id> ends a request through DONE"),
    Capability("context_exceeded", COLIBRI, "colibri", "protocol.md §2.3 step 14, §2.8",
               "ERROR CONTEXT_EXCEEDED <nt> <CTX-2> and the max_tokens clamp to the context"),
    Capability("logprobs", COLIBRI, "colibri", "protocol.md §2.5",
               "logprobs=k tails on DATA and ECHO frames"),
    Capability("ids", COLIBRI, "colibri", "protocol.md §2.2", "ids=1 token-id payloads"),
    Capability("persistence", COLIBRI, "colibri", "protocol.md §2.9, §4",
               "KV and usage persisted under COLI_PERSIST/KVSAVE, in COLI_STATE_DIR"),
    Capability("prof", COLIBRI, "colibri", "protocol.md §2.6 (PROF)",
               "a PROF line in the turn-end block"),
    Capability("per_request_seed", COLIBRI, "colibri", "protocol.md §2.2 (seed=)",
               "the seed= SUBMIT extension"),
    Capability("mtp", COLIBRI, "colibri", "protocol.md §2.7 (MTP drafting)",
               "single-slot MTP drafting"),
    Capability("stats_dump", COLIBRI, "colibri", "protocol.md §4.2 (STATS)",
               "the routing-count dump STATS names, written at exit (probed: no CAPS key)"),
    # Extensions of this project.
    Capability("caps", COLIBRI, "project", "protocol.md §2.1 (CAPS)",
               "the CAPS handshake line"),
    Capability("submit_ext", COLIBRI, "project", "protocol.md §2.2, §2.3",
               "SUBMIT's optional gbytes field and key=value extensions (unknown keys refused)"),
    Capability("grammar", COLIBRI, "project", "protocol.md §2.2 (Grammar)",
               "grammar sections constrain sampling"),
    Capability("echo_at", COLIBRI, "project", "protocol.md §2.2 (echo_at=)",
               "the echo_at= SUBMIT extension: score only the prompt's tail from a byte offset"),
    Capability("strict_validation", COLIBRI, "project", "protocol.md §2.3",
               "the validation order: value ranges, canonical ids, BAD_FRAME, line limits"),
    Capability("drain_rule", COLIBRI, "project", "protocol.md §2.3 steps 6 and 9",
               "a value-refused SUBMIT's payload is drained, an unframeable one's is not"),
    Capability("turn_end_block", COLIBRI, "project", "protocol.md §2.7",
               "the turn-end block in the fixed order HWINFO GPUS TIERS EMAP HITS ENTROPY "
               "PERF PROF"),
    Capability("batch_order", COLIBRI, "project", "protocol.md §2.7",
               "a decode step's DATA frames in ascending slot order"),
    Capability("state_layout", COLIBRI, "project", "protocol.md §4.2, §4.3",
               "the .coli_usage header record and the .coli_kv record layout"),
    Capability("ram_budget", COLIBRI, "project", "protocol.md §2.4 (EXPERT_READ), §2.9 (RAM_GB)",
               "under RAM_GB routed experts are read from the model's files; a read that fails "
               "ends the request with ERROR <id> EXPERT_READ and the engine serves on"),
    # The serve_codec dialect: the codec's fixed rules, then one capability per switch of its
    # wire profile (ColiServeWireProfile), which each family engine sets for itself.
    Capability(CODEC_WIRE, SERVE_CODEC, "colibri", "protocol.md §5",
               "the serve_codec dialect (c/serve_codec.h): string ids, SUBMIT keys without "
               "gbytes, at most 10 fields, unknown commands ignored, its STAT and DONE formats"),
    Capability("extension_bytes", SERVE_CODEC, "colibri", "protocol.md §5.2",
               "SUBMIT's 8th positional field: an extension section after the payload"),
    Capability("prefix_hint", SERVE_CODEC, "colibri", "protocol.md §5.2",
               "SUBMIT's 9th positional field: the prefix_bytes hint (DeepSeek V4)"),
    Capability("finite_sampling", SERVE_CODEC, "colibri", "protocol.md §5.2",
               "a nan or inf temperature or top_p refuses the SUBMIT"),
    Capability("exact_lf", SERVE_CODEC, "colibri", "protocol.md §5.2, §5.4",
               "a body not ended by LF is BAD_FRAME: the engine stops reading"),
    # Facts of the model or the harness: they gate cases but belong to no profile.
    Capability("text_prompts", CORE, "target", "conformance.md (prompts)",
               "payloads are text the engine tokenizes"),
    Capability("oracle", CORE, "target", "conformance.md (golden)",
               "the model directory has an oracle.json"),
    Capability("byte_tokenizer", CORE, "target", "conformance.md (byte-level tokenizer)",
               "the suite drives the model through its byte-level tokenizer"),
)

CAPABILITIES: dict[str, Capability] = {c.name: c for c in _ALL}

#: Assumed for every protocol target: the seed defines them.
SEED_CORE = frozenset(c.name for c in _ALL if c.origin == "seed")
EXTENSIONS = frozenset(c.name for c in _ALL if c.profile == COLIBRI)
CODEC = frozenset(c.name for c in _ALL if c.profile == SERVE_CODEC)
TARGET_FACTS = frozenset(c.name for c in _ALL if c.origin == "target")
PROFILES: dict[str, frozenset[str]] = {
    CORE: SEED_CORE,
    COLIBRI: SEED_CORE | EXTENSIONS,
    SERVE_CODEC: CODEC,
}
#: What a target description may declare: no probe or CAPS key can tell these.
DECLARABLE = EXTENSIONS | CODEC

#: Capabilities that protocol.md revision 1 defines without a CAPS key of their own: an
#: engine announcing ``CAPS proto=1`` claims them all.
REVISION_1 = frozenset(
    {"caps", "accept", "stop", "context_exceeded", "persistence", "prof", "submit_ext",
     "strict_validation", "drain_rule", "turn_end_block", "batch_order", "state_layout",
     "ram_budget"}
)

#: CAPS keys (and older spellings) -> capability names; a value 0 means "not supported".
CAPS_KEYS = {
    "logprobs": "logprobs",
    "echo": "logprobs",
    "ids": "ids",
    "token_ids": "ids",
    "topk": "topk_frames",
    "topk_frames": "topk_frames",
    "seed": "per_request_seed",
    "per_request_seed": "per_request_seed",
    "persist": "persistence",
    "persistence": "persistence",
    "kv_persist": "persistence",
    "legacy": "legacy_protocol",
    "legacy_protocol": "legacy_protocol",
    "mtp": "mtp",
    "grammar": "grammar",
    "stop": "stop",
    "accept": "accept",
    "context_exceeded": "context_exceeded",
    "echo_at": "echo_at",
}

#: Frame kinds an extension adds: where the target lacks it, a case's frame-order pattern
#: does not expect the kind (see :func:`pattern_for`).
EXTENSION_FRAMES = {"ACCEPT": "accept", "PROF": "prof", "CAPS": "caps"}


def profile_of(requires: frozenset[str]) -> str:
    """A case needing a serve_codec capability belongs to `serve_codec`; otherwise to `core`
    iff it needs nothing beyond the seed and target facts."""
    if requires & CODEC:
        return SERVE_CODEC
    return CORE if requires <= SEED_CORE | TARGET_FACTS else COLIBRI


def unknown(names: frozenset[str] | set[str]) -> list[str]:
    return sorted(set(names) - set(CAPABILITIES))


def from_caps(pairs: dict[str, str]) -> set[str]:
    """Capabilities a CAPS line claims: the keyed ones announced non-zero, plus revision 1's
    unkeyed ones when ``proto`` is at least 1."""
    found = {"caps"}
    for key, value in pairs.items():
        name = CAPS_KEYS.get(key.lower())
        if name and value not in ("0", "false", "off", "no"):
            found.add(name)
    proto = pairs.get("proto", "")
    if proto.isdigit() and int(proto) >= 1:
        found |= REVISION_1
    return found


def pattern_for(pattern: str, capabilities: set[str] | frozenset[str]) -> str:
    """A frame-order pattern as it applies to a target.

    Patterns are written for the full protocol (``ACCEPT( DATA)+( PERF)? DONE``); a kind
    that only an extension sends is dropped, with its leading space, where the target lacks
    that extension, so ``( DATA)+( PERF)? DONE`` is what a seed engine is held to. Matching
    is done on the kinds joined with a leading space (see :func:`kinds_text`).
    """
    out = " " + pattern
    for kind, capability in EXTENSION_FRAMES.items():
        if capability not in capabilities:
            out = re.sub(rf" {kind}\b", "", out)
    return out


def kinds_text(kinds: list[str]) -> str:
    """Frame kinds in the form :func:`pattern_for` patterns match: each after one space."""
    return "".join(" " + kind for kind in kinds)
