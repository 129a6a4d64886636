"""Write spec/protocol.json: the machine-readable grammar of colibri's engine wire protocols.

The JSON is the normative artefact (the conformance suite, the server's engine client and the
reference engine's tests load it); this script only exists so that every line kind's regex is
derived from its field grammar and the two can never disagree. Run it after editing a grammar:

    python tools/gen_protocol_json.py          # rewrite spec/protocol.json
    python tools/gen_protocol_json.py --check  # exit 1 if the committed file is stale

spec/protocol.md explains every entry in prose.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TARGET = ROOT / "spec" / "protocol.json"

Json = dict[str, Any]

# One regex per scalar type. Engine output is canonical (exactly these spellings); requests are
# read with the looser `req_*` types. Regexes are Python/PCRE/ECMAScript compatible.
TYPES: dict[str, Json] = {
    "u64": {
        "regex": "0|[1-9][0-9]{0,19}",
        "min": 0,
        "max": 18446744073709551615,
        "description": "unsigned 64-bit decimal, canonical (no sign, no leading zeros)",
    },
    "uint": {
        "regex": "0|[1-9][0-9]{0,9}",
        "min": 0,
        "max": 2147483647,
        "description": "non-negative 32-bit decimal, canonical",
    },
    "int": {
        "regex": "0|-?[1-9][0-9]{0,9}",
        "min": -2147483648,
        "max": 2147483647,
        "description": "signed 32-bit decimal, canonical",
    },
    "flag": {"regex": "[01]", "min": 0, "max": 1, "description": "0 or 1"},
    "fixed1": {"regex": "-?[0-9]+\\.[0-9]", "description": "C %.1f"},
    "fixed2": {"regex": "-?[0-9]+\\.[0-9]{2}", "description": "C %.2f"},
    "fixed3": {"regex": "-?[0-9]+\\.[0-9]{3}", "description": "C %.3f"},
    "fixed6": {"regex": "-?[0-9]+\\.[0-9]{6}", "description": "C %.6f"},
    "logprob": {
        "regex": "-?[0-9]+\\.[0-9]{6}|nan|-?inf",
        "description": "natural-log probability, C %.6f; nan/inf/-inf spelled as libc prints them",
    },
    "hex": {
        "regex": "(?:[0-9a-f]{2})*",
        "description": "lowercase hex, two characters per byte (length fixed by the line kind)",
    },
    "hextext": {
        "regex": "-|(?:[0-9a-f]{2})+",
        "description": "a token's bytes in lowercase hex; '-' when the token has no bytes",
    },
    "code": {"regex": "[A-Z_]+", "description": "an error code from the `errors` table"},
    "capability": {
        "regex": "[a-z_]{1,15}=(?:0|[1-9][0-9]{0,19})",
        "description": "key=value, key [a-z_]{1,15}, value a canonical u64",
    },
    "text": {"regex": "[^\\n]*", "description": "free text to the end of the line (no LF)"},
    # Request-side (server -> engine) spellings, accepted by the engine.
    "req_uint": {
        "regex": "[0-9]{1,20}",
        "description": "decimal digits (leading zeros allowed, no sign); range per field",
    },
    "req_float": {
        "regex": "[+-]?(?:[0-9]+\\.?[0-9]*|\\.[0-9]+)(?:[eE][+-]?[0-9]+)?",
        "description": "decimal float as the gateway's %.8g writes it; nan/inf are not accepted",
    },
    "req_ext": {
        "regex": "[a-z_]{1,15}=[0-9]{1,20}",
        "description": "request extension key=value (keys and ranges in `extensions`)",
    },
}


def f(name: str, type_: str, **extra: Any) -> Json:
    """A scalar field."""
    return {"name": name, "type": type_, **extra}


def lit(text: str) -> Json:
    """A fixed word."""
    return {"literal": text}


def repeat(name: str, count: str | int | None, fields: list[Json], **extra: Any) -> Json:
    """A group repeated `count` times (a field name, a fixed number, or None: any number)."""
    return {"name": name, "repeat": count, "fields": fields, **extra}


def optional(name: str, fields: list[Json]) -> Json:
    """A group that is present entirely or absent entirely."""
    return {"name": name, "optional": fields}


def _item_regex(item: Json, named: bool) -> str:
    """The regex of one grammar item, including the single space that precedes it."""
    if "literal" in item:
        return " " + str(item["literal"])
    if "type" in item:
        body = TYPES[item["type"]]["regex"]
        if named:
            return f" (?P<{item['name']}>{body})"
        return f" (?:{body})"
    if "optional" in item:
        return "(?:" + "".join(_item_regex(i, named) for i in item["optional"]) + ")?"
    inner = "".join(_item_regex(i, False) for i in item["fields"])
    count = item["repeat"]
    quant = f"{{{count}}}" if isinstance(count, int) else "*"
    return f"(?P<{item['name']}>(?:{inner}){quant})" if named else f"(?:{inner}){quant}"


def line_regex(kind: str, fields: list[Json]) -> str:
    return "^" + kind + "".join(_item_regex(i, True) for i in fields) + "$"


def kind(
    name: str,
    direction: str,
    protocols: list[str],
    fields: list[Json],
    description: str,
    source: str,
    *,
    tagged: bool = False,
    payload: Json | None = None,
    category: str = "response",
    regex: str | None = None,
    **extra: Any,
) -> Json:
    entry: Json = {
        "kind": name,
        "direction": direction,
        "protocols": protocols,
        "category": category,
        "tagged": tagged,
        "source": source,
        "fields": fields,
        "regex": regex if regex is not None else line_regex(name, fields),
        "payload": payload,
        "description": description,
    }
    entry.update(extra)
    return entry


TOP_ENTRY = [f("token", "uint"), f("logprob", "logprob")]


def engine_lines() -> list[Json]:
    mux, legacy, both = ["mux"], ["legacy"], ["mux", "legacy"]
    stat_fields = [
        f("produced", "uint"),
        f("tok_s", "fixed2"),
        f("hit_pct", "fixed1"),
        f("rss_gb", "fixed2"),
        optional("turn", [f("prompt_tokens", "uint"), f("length_limited", "flag")]),
    ]
    return [
        kind(
            "READY",
            "engine",
            both,
            [],
            "Handshake sentinel, bytes 01 01 'READY' 01 01 0a. Everything before it is free-form "
            "preamble; the server sends nothing before it.",
            "code",
            category="handshake",
            regex="^\\x01\\x01READY\\x01\\x01$",
            exact="\u0001\u0001READY\u0001\u0001",
        ),
        kind(
            "END",
            "engine",
            legacy,
            [],
            "Legacy end-of-turn sentinel, bytes 01 01 'END' 01 01 0a; a STAT line follows. In "
            "interactive turns a LF precedes the sentinel (it ends the streamed text).",
            "code",
            category="legacy",
            regex="^\\x01\\x01END\\x01\\x01$",
            exact="\u0001\u0001END\u0001\u0001",
        ),
        kind(
            "STAT",
            "engine",
            both,
            stat_fields,
            "Right after READY: 'STAT 0 0.00 0.0 <rss_gb>'. Legacy turn end (after END): "
            "produced tokens, decode tok/s, expert-cache hit %, peak RSS GB, then prompt tokens "
            "and length_limited (absent on early-failure replies).",
            "code",
            category="handshake",
        ),
        kind(
            "CAPS",
            "engine",
            mux,
            [repeat("caps", None, [f("capability", "capability")])],
            "Capability announcement, the line right after the startup STAT (servers that do "
            "not know it ignore it). Keys in `capabilities`.",
            "extension",
            category="handshake",
        ),
        kind(
            "HWINFO",
            "engine",
            both,
            [
                f("cores", "uint"),
                f("ram_total_gb", "fixed1"),
                f("ram_avail_gb", "fixed1"),
                f("ngpu", "uint"),
                f("vram_total_gb", "fixed1"),
                f("cpu_gpu", "text", split="|"),
            ],
            "Host snapshot: online cores, RAM total/available GB, CUDA device count, VRAM "
            "total GB, then '<cpu name>|<gpu name>' (free text, may contain spaces).",
            "code",
            category="telemetry",
        ),
        kind(
            "GPUS",
            "engine",
            mux,
            [
                f("n", "uint"),
                repeat(
                    "devices",
                    "n",
                    [f("used_gb", "fixed3"), f("total_gb", "fixed3"), f("experts", "uint")],
                ),
            ],
            "Per-device VRAM used/total GB and resident expert count; 'GPUS 0' without devices.",
            "code",
            category="telemetry",
        ),
        kind(
            "TIERS",
            "engine",
            both,
            [
                f("vram", "uint"),
                f("ram", "uint"),
                f("disk", "uint"),
                f("vram_gb", "fixed2"),
                f("ram_gb", "fixed2"),
            ],
            "Routed-expert count per tier (vram + ram + disk = rows*cols of EMAP) and resident "
            "GB of the VRAM and RAM tiers.",
            "code",
            category="telemetry",
        ),
        kind(
            "EMAP",
            "engine",
            mux,
            [f("rows", "uint"), f("cols", "uint"), f("map", "hex", hex_bytes="rows*cols")],
            "One byte per expert, row-major over (sparse layers [+ MTP]) x experts: "
            "(tier << 6) | heat, tier 0 disk / 1 RAM / 2 VRAM, heat = bit length of the "
            "cumulative usage count (capped at 63).",
            "code",
            category="telemetry",
        ),
        kind(
            "HITS",
            "engine",
            mux,
            [f("rows", "uint"), f("cols", "uint"), f("bits", "hex", hex_bytes="(rows*cols+7)/8")],
            "Bitmap of experts routed since the previous HITS; bit index row*cols+expert, "
            "LSB-first within each byte, padding bits zero.",
            "code",
            category="telemetry",
        ),
        kind(
            "ENTROPY",
            "engine",
            mux,
            [repeat("layers", None, [f("bits", "fixed3")])],
            "Routing entropy (bits) of this turn's expert selections over the rows that "
            "forwarded its generated tokens, one value per EMAP row.",
            "seed",
            category="telemetry",
        ),
        kind(
            "PERF",
            "engine",
            mux,
            [
                f("id", "u64"),
                f("dt", "fixed6"),
                f("t_edisk", "fixed6"),
                f("t_ewait", "fixed6"),
                f("t_emm", "fixed6"),
                f("t_attn", "fixed6"),
                f("t_kvb", "fixed6"),
                f("t_head", "fixed6"),
            ],
            "This turn's time split in seconds: decode wall time, expert disk reads, expert "
            "wait (async loads), expert matmuls, attention, KV bookkeeping, lm_head.",
            "seed",
            category="telemetry",
            tagged=True,
        ),
        kind(
            "PROF",
            "engine",
            mux,
            [
                f("wall_s", "fixed3"),
                f("prompt_tokens", "uint"),
                f("completion_tokens", "uint"),
                f("edisk_s", "fixed3"),
                f("ewait_s", "fixed3"),
                f("emm_s", "fixed3"),
                f("attn_s", "fixed3"),
                f("head_s", "fixed3"),
                f("forwards", "u64"),
                f("fwd_p50_ms", "fixed3"),
                f("fwd_p99_ms", "fixed3"),
                f("physical_bytes", "u64"),
                f("rammap_experts", "uint"),
                f("rammap_bytes", "u64"),
                f("ttft_ms", "fixed3"),
                f("prefault_s", "fixed3"),
                f("physical_valid", "flag"),
            ],
            "Per-turn profile, the 18-field form of colibri's newest engine; the line right "
            "before DONE.",
            "code",
            category="telemetry",
        ),
        kind(
            "REPIN",
            "engine",
            mux,
            [f("layer", "uint"), f("eid", "uint"), f("old_tier", "uint"), f("gpu", "int")],
            "A live hot-set swap: expert `eid` of decoder layer `layer` was admitted to the "
            "pinned set from tier `old_tier`; gpu is the device ordinal, -1 for RAM.",
            "seed",
            category="telemetry",
        ),
        kind(
            "ACCEPT",
            "engine",
            mux,
            [f("id", "u64"), f("prompt_tokens", "uint")],
            "The SUBMIT passed validation; prompt token count after tokenization.",
            "code",
            tagged=True,
        ),
        kind(
            "DATA",
            "engine",
            mux,
            [
                f("id", "u64"),
                f("n", "uint", max=65536),
                optional(
                    "logprobs",
                    [
                        f("logprob", "logprob"),
                        f("k", "uint", max=32),
                        repeat("top", "k", TOP_ENTRY),
                    ],
                ),
            ],
            "One generated token: n payload bytes (the token's raw bytes, possibly a partial "
            "UTF-8 sequence; ' <token id>' for a model without tokenizer). The logprob tail "
            "appears iff the request had logprobs=k>0.",
            "code",
            tagged=True,
            payload={"length_field": "n", "terminator": "\n"},
        ),
        kind(
            "ECHO",
            "engine",
            mux,
            [
                f("id", "u64"),
                f("n", "uint", max=65536),
                f("pos", "uint"),
                f("logprob", "logprob"),
                f("k", "uint", max=32),
                repeat("top", "k", TOP_ENTRY),
            ],
            "Prompt position `pos` (logprobs>0 requests only, positions 0..P-1 before any "
            "DATA): the token's bytes, its logprob given the positions before it, and the "
            "top-k table; position 0 has exactly ' nan 0'.",
            "code",
            tagged=True,
            payload={"length_field": "n", "terminator": "\n"},
        ),
        kind(
            "TOPK",
            "engine",
            mux,
            [
                f("id", "u64"),
                f("count", "uint", max=5),
                repeat("candidates", "count", [f("logprob", "logprob"), f("text", "hextext")]),
            ],
            "With SERVE_TOPK=1, right after each DATA: the 5 most likely tokens of the row the "
            "token was sampled from (descending logprob, ties by ascending id).",
            "seed",
            tagged=True,
        ),
        kind(
            "DONE",
            "engine",
            mux,
            [
                f("id", "u64"),
                lit("STAT"),
                f("emitted", "uint"),
                f("tok_s", "fixed2"),
                f("hit_pct", "fixed1"),
                f("rss_gb", "fixed2"),
                f("prompt_tokens", "uint"),
                f("length_limited", "flag"),
            ],
            "End of a successful (or STOPped) request: DATA count, decode tok/s, expert-cache "
            "hit %, peak RSS GB, prompt tokens (= ACCEPT's), length_limited.",
            "code",
            tagged=True,
        ),
        kind(
            "ERROR",
            "engine",
            mux,
            [
                f("id", "u64"),
                f("code", "code"),
                optional("context", [f("prompt_tokens", "uint"), f("limit", "uint")]),
            ],
            "A request failed or was cancelled; id 0 when the header could not be framed. "
            "Only CONTEXT_EXCEEDED carries the two extra numbers.",
            "code",
            tagged=True,
        ),
    ]


def request_lines() -> list[Json]:
    mux, legacy = ["mux"], ["legacy"]
    return [
        kind(
            "SUBMIT",
            "server",
            mux,
            [
                f("id", "req_uint", min=1, max=18446744073709551615),
                f("slot", "req_uint", min=0, max="KV_SLOTS-1"),
                f("bytes", "req_uint", min=0, max=16777216),
                f("max_tokens", "req_uint", min=0, max=2147483647),
                f("temperature", "req_float", min=0.0, max=2.0),
                f("top_p", "req_float", min_exclusive=0.0, max=1.0),
                optional(
                    "grammar",
                    [
                        f("gbytes", "req_uint", min=0, max=1048576),
                    ],
                ),
                repeat("extensions", None, [f("extension", "req_ext")]),
            ],
            "A request: `bytes` payload bytes then `gbytes` grammar bytes then exactly one LF "
            "follow the header. Extensions may follow gbytes (colibri's GLM form) or directly "
            "top_p (the serve_codec form). max_tokens 0 is allowed only with logprobs>0.",
            "code",
            category="request",
            payload={"length_field": "bytes", "extra_length_field": "gbytes", "terminator": "\n"},
        ),
        kind(
            "STOP",
            "server",
            mux,
            [f("id", "req_uint", min=1, max=18446744073709551615)],
            "Finish the request normally now (telemetry block + DONE, length_limited 0).",
            "code",
            category="request",
        ),
        kind(
            "CANCEL",
            "server",
            mux,
            [f("id", "req_uint", min=1, max=18446744073709551615)],
            "Abort the request: its KV is persisted, then ERROR <id> CANCELLED; no DONE.",
            "code",
            category="request",
        ),
        kind(
            "RESET",
            "server",
            legacy,
            [],
            "Legacy: clear the conversation (and the slot's .coli_kv record count).",
            "code",
            category="request",
            regex="^\\x02RESET$",
            exact="\u0002RESET",
        ),
        kind(
            "MORE",
            "server",
            legacy,
            [],
            "Legacy: continue the previous answer for up to NGEN more tokens.",
            "code",
            category="request",
            regex="^\\x02MORE$",
            exact="\u0002MORE",
        ),
        kind(
            "PROMPT",
            "server",
            legacy,
            [
                f("bytes", "req_uint", min=0, max=16777216),
                f("max_tokens", "req_uint", min=1, max=2147483647),
                f("temperature", "req_float", min=0.0, max=2.0),
                f("top_p", "req_float", min_exclusive=0.0, max=1.0),
                optional("slot", [f("kv_slot", "req_uint", min=0, max="KV_SLOTS-1")]),
            ],
            "Legacy API mode: a raw prompt of `bytes` bytes follows, then LF (a different "
            "byte is tolerated and kept as the start of the next line).",
            "code",
            category="request",
            regex=None,
            payload={"length_field": "bytes", "terminator": "\n", "lenient_terminator": True},
            prefix="\u0002",
        ),
    ]


def fix_prompt_regex(entries: list[Json]) -> None:
    for entry in entries:
        if entry["kind"] == "PROMPT":
            entry["regex"] = "^\\x02" + line_regex("PROMPT", entry["fields"])[1:]


ERRORS: list[Json] = [
    {
        "code": "BAD_REQUEST",
        "args": [],
        "meaning": "a malformed command line, an unframeable SUBMIT header (id 0), or a framed "
        "SUBMIT whose values are out of range, whose extensions are unknown/duplicated/out of "
        "range, whose payload holds NUL or invalid UTF-8, or whose ids=1 payload is malformed",
        "effect": "continue",
    },
    {
        "code": "BAD_FRAME",
        "args": [],
        "meaning": "the byte after payload+grammar is not LF",
        "effect": "stop_reading",
    },
    {
        "code": "SLOT_BUSY",
        "args": [],
        "meaning": "the target slot has an active request",
        "effect": "continue",
    },
    {
        "code": "DUPLICATE_ID",
        "args": [],
        "meaning": "the id equals an active request's id",
        "effect": "continue",
    },
    {
        "code": "EMPTY_PROMPT",
        "args": [],
        "meaning": "the prompt tokenized to zero tokens",
        "effect": "continue",
    },
    {
        "code": "CONTEXT_EXCEEDED",
        "args": ["prompt_tokens", "limit"],
        "meaning": "prompt tokens > CTX-2; limit = CTX-2",
        "effect": "continue",
    },
    {
        "code": "NOT_FOUND",
        "args": [],
        "meaning": "STOP or CANCEL of an id that is not active",
        "effect": "continue",
    },
    {
        "code": "CANCELLED",
        "args": [],
        "meaning": "acknowledges CANCEL, after the slot's KV was persisted",
        "effect": "continue",
    },
    {
        "code": "BAD_GRAMMAR",
        "args": [],
        "meaning": "the grammar section is not UTF-8, does not compile, uses an unsupported "
        "feature, or the model has no tokenizer to constrain",
        "effect": "continue",
    },
]

VALIDATION_ORDER: list[Json] = [
    {
        "step": 1,
        "check": "line longer than max_header_bytes (drained to LF)",
        "reply": "ERROR 0 BAD_REQUEST",
    },
    {
        "step": 2,
        "check": (
            "line starts 'STOP ' or 'CANCEL ' but is not exactly '<VERB> <id>' with 1 <= id < 2^64"
        ),
        "reply": "ERROR 0 BAD_REQUEST",
    },
    {
        "step": 3,
        "check": "STOP of an active id",
        "reply": "telemetry block, DONE <id> STAT ... (length_limited 0)",
    },
    {
        "step": 4,
        "check": "STOP/CANCEL of an id that is not active",
        "reply": "ERROR <id> NOT_FOUND",
    },
    {
        "step": 5,
        "check": "CANCEL of an active id",
        "reply": ".coli_kv append, then ERROR <id> CANCELLED",
    },
    {
        "step": 6,
        "check": (
            "not a SUBMIT that can be framed: verb, field count/shape, "
            "id/slot/bytes/max_tokens/gbytes not digit strings, bytes > 16 MiB, gbytes > 1 "
            "MiB; the payload is NOT drained"
        ),
        "reply": "ERROR 0 BAD_REQUEST",
    },
    {
        "step": 7,
        "check": "EOF before payload+grammar+terminator are complete",
        "reply": "nothing; treated as EOF",
    },
    {
        "step": 8,
        "check": "byte after payload+grammar is not LF",
        "reply": "ERROR <id> BAD_FRAME, stdin is no longer read",
    },
    {
        "step": 9,
        "check": (
            "value checks: id 0 or >= 2^64, slot >= KV_SLOTS, max_tokens > 2^31-1, "
            "temperature not in [0,2], top_p not in (0,1], extension unknown/duplicate/out "
            "of range, max_tokens 0 without logprobs>0, echo_at>0 without logprobs>0 or with "
            "ids=1, NUL in payload or grammar"
        ),
        "reply": "ERROR <id> BAD_REQUEST",
    },
    {"step": 10, "check": "the slot has an active request", "reply": "ERROR <id> SLOT_BUSY"},
    {"step": 11, "check": "the id is active (on another slot)", "reply": "ERROR <id> DUPLICATE_ID"},
    {
        "step": 12,
        "check": (
            "payload not valid UTF-8 (text mode), model has no tokenizer and ids=0, ids=1 "
            "payload malformed or an id >= vocab"
        ),
        "reply": "ERROR <id> BAD_REQUEST",
    },
    {"step": 13, "check": "zero prompt tokens", "reply": "ERROR <id> EMPTY_PROMPT"},
    {
        "step": 14,
        "check": "prompt tokens > CTX-2",
        "reply": "ERROR <id> CONTEXT_EXCEEDED <nt> <CTX-2>",
    },
    {
        "step": 15,
        "check": (
            "CAPS grammar=1 and the grammar section is not UTF-8, does not compile or uses an "
            "unsupported feature, or the model has no tokenizer"
        ),
        "reply": "ERROR <id> BAD_GRAMMAR",
    },
    {"step": 16, "check": "accepted", "reply": "ACCEPT <id> <nt>, then prefill"},
]

EXTENSIONS: list[Json] = [
    {
        "key": "logprobs",
        "min": 0,
        "max": 32,
        "meaning": (
            "k>0: per-token logprob tail on DATA, ECHO for every prompt position, the "
            "slot's cached prefix is discarded"
        ),
        "source": "code",
    },
    {
        "key": "ids",
        "min": 0,
        "max": 1,
        "meaning": "1: the payload is decimal token ids separated by bytes <= 0x20",
        "source": "code",
    },
    {
        "key": "pin",
        "min": 0,
        "max": 1,
        "meaning": "accepted for compatibility with colibri's parser; no effect (no snapshot pool)",
        "source": "code",
    },
    {
        "key": "seed",
        "min": 0,
        "max": 18446744073709551615,
        "meaning": (
            "this request's sampling RNG starts from seed*0x9E3779B97F4A7C15+1 (mod 2^64), "
            "as SEED does"
        ),
        "source": "extension",
    },
    {
        "key": "echo_at",
        "min": 0,
        "max": 16777216,
        "meaning": (
            "with logprobs>0 and a text payload: ECHO only for positions s..nt-1, s = the first "
            "token whose bytes reach past payload byte echo_at; the cached prefix is kept up to "
            "s-1 (0: every position, prefix discarded)"
        ),
        "source": "extension",
    },
]

CAPABILITIES: list[Json] = [
    {"key": "proto", "meaning": "protocol revision of this document (1)"},
    {"key": "accept", "meaning": "1: ACCEPT is sent for every accepted SUBMIT"},
    {"key": "stop", "meaning": "1: STOP is understood"},
    {"key": "logprobs", "meaning": "largest logprobs=k accepted (0: the extension is refused)"},
    {"key": "echo", "meaning": "1: logprobs>0 requests get ECHO frames"},
    {"key": "echo_at", "meaning": "1: the echo_at= extension is accepted"},
    {"key": "ids", "meaning": "1: ids=1 payloads are accepted"},
    {"key": "seed", "meaning": "1: the seed= extension is accepted"},
    {
        "key": "grammar",
        "meaning": "1: grammar bytes constrain sampling (JSON Schema, llguidance Lark or "
        "GBNF); 0: they are read and ignored",
    },
    {"key": "topk", "meaning": "1: TOPK frames follow each DATA (SERVE_TOPK=1)"},
    {
        "key": "hits_every",
        "meaning": "decode steps between periodic HITS lines (0: only in the turn-end block)",
    },
    {"key": "slots", "meaning": "KV_SLOTS"},
    {"key": "ctx", "meaning": "CTX (context length in tokens)"},
    {"key": "vocab", "meaning": "vocabulary size (bound for ids=1 token ids)"},
    {
        "key": "tokenizer",
        "meaning": "1: text payloads are tokenized; 0: only ids=1 requests can be served",
    },
    {"key": "mtp", "meaning": "1: single-slot MTP drafting is active"},
]


def build() -> Json:
    requests = request_lines()
    fix_prompt_regex(requests)
    return {
        "$comment": "Generated by tools/gen_protocol_json.py; prose in spec/protocol.md.",
        "name": "colibri-serve",
        "revision": 1,
        "encoding": "bytes; lines end in a single LF (0x0a), never CRLF; header lines are ASCII",
        "types": TYPES,
        "limits": {
            "max_payload_bytes": 16777216,
            "max_grammar_bytes": 1048576,
            "max_header_bytes": 4096,
            "max_logprobs": 32,
            "max_frame_payload_bytes": 65536,
            "kv_slots_min": 1,
            "kv_slots_max": 16,
            "default_kv_slots": 1,
            "default_ctx": 4096,
            "hits_every_steps": 6,
            "topk_count": 5,
        },
        "lines": engine_lines() + requests,
        "errors": ERRORS,
        "extensions": EXTENSIONS,
        "capabilities": CAPABILITIES,
        "validation_order": VALIDATION_ORDER,
        "mux": {
            "handshake": ["READY", "STAT", "CAPS", "HWINFO", "GPUS", "TIERS", "EMAP"],
            "turn_end_block": [
                "HWINFO",
                "GPUS",
                "TIERS",
                "EMAP",
                "HITS",
                "ENTROPY",
                "PERF",
                "PROF",
            ],
            "request_sequence": (
                "ERROR | ACCEPT ECHO* (DATA TOPK?)* (<turn_end_block> DONE | ERROR)"
            ),
            "untagged_anywhere": ["HITS", "REPIN"],
            "unknown_kinds": "ignore (forward compatibility); a known kind that does not match "
            "its grammar is a protocol error",
            "payload_kinds": ["DATA", "ECHO"],
        },
        "legacy": {
            "handshake": ["READY", "STAT", "TIERS"],
            "turn_reply": "<raw text> [LF] END STAT",
        },
        "stats_dump": {
            "env": "STATS",
            "when": "once, at exit (mux and legacy), after the last turn's usage save",
            "format": "the .coli_usage text format (spec/protocol.md 4.2), of the in-memory "
            "counters: the loaded history plus this process's routing",
            "header_regex": "^-1 (?P<n_layers>0|[1-9][0-9]*) (?P<n_experts>[1-9][0-9]*)$|"
            "^-2 (?P<version>1) (?P<engine_id>0|[1-9][0-9]*)$",
            "record_regex": "^(?P<layer>0|[1-9][0-9]*) (?P<expert>0|[1-9][0-9]*) "
            "(?P<count>[1-9][0-9]*)$",
            "on_write_failure": "message on stderr, exit status 1",
            "controls": {
                "fresh_usage": "COLI_PERSIST=0 (nothing loaded, nothing saved)",
                "no_drafts": "DRAFT=0 (rejected MTP drafts would be counted)",
                "no_expert_pruning": "the reference router never prunes (TOPP is not read)",
            },
        },
    }


def render() -> str:
    return json.dumps(build(), indent=2, ensure_ascii=True) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if spec/protocol.json is stale")
    args = parser.parse_args()
    text = render()
    if args.check:
        if TARGET.read_text() != text:
            print(
                "spec/protocol.json is stale: run python tools/gen_protocol_json.py",
                file=sys.stderr,
            )
            return 1
        return 0
    TARGET.write_text(text)
    print(TARGET)
    return 0


if __name__ == "__main__":
    sys.exit(main())
