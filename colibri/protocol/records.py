"""The line codec: every frame kind of spec/protocol.json as one typed record.

``record.line()`` spells the header line (no LF) the way colibri's engine prints it (C number
formats, spec/protocol.md 1.1), ``record.encode()`` gives the frame's exact bytes (header, LF,
and for DATA/ECHO/SUBMIT/PROMPT the payload and its terminator); ``Kind.decode(header,
payload)`` (or the module's ``decode``) parses a header with its grammar (``parse_line``) into
the record. This is the only module that writes a wire keyword or spells a number for the wire.

Decoding is strict by default: the conformance suite and the tests hold our engine to the
spec's exact spellings. ``strict=False`` is the tolerant reading a server uses on any engine's
output (``colibri.protocol.lines`` says what it tolerates and why); what it reads into a
record is the same record, so a tolerant reader never sees a second set of types.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Self, TypeVar

from colibri.protocol.lines import ParsedLine, parse_line
from colibri.protocol.spec import SPEC, ProtocolViolation

# --- C number spellings ---------------------------------------------------------------------


def f1(x: float) -> str:
    """C ``%.1f``."""
    return f"{x:.1f}"


def f2(x: float) -> str:
    """C ``%.2f``."""
    return f"{x:.2f}"


def f3(x: float) -> str:
    """C ``%.3f``."""
    return f"{x:.3f}"


def f6(x: float) -> str:
    """C ``%.6f`` as glibc prints it: non-finite values are nan, inf and -inf (Python's
    %-formatting agrees for finite values and infinities)."""
    if math.isnan(x):
        return "nan"
    return f"{x:.6f}"


def logprob(x: float) -> str:
    """A logprob (``%.6f``); a NaN keeps its sign bit as glibc does (``-nan``)."""
    if math.isnan(x):
        return "nan" if math.copysign(1.0, x) > 0 else "-nan"
    return f"{x:.6f}"


def g8(x: float) -> str:
    """The gateway's ``%.8g`` for SUBMIT and PROMPT floats."""
    return f"{x:.8g}"


def _hextext(data: bytes) -> str:
    return data.hex() or "-"


def _unhextext(text: str) -> bytes:
    return b"" if text == "-" else bytes.fromhex(text)


# --- the records ----------------------------------------------------------------------------

R = TypeVar("R", bound="Record")


class Record:
    """What every frame record has: its kind, its header line, its bytes, its decoder."""

    KIND: ClassVar[str] = ""
    DIRECTION: ClassVar[str] = "engine"

    def line(self) -> str:
        raise NotImplementedError

    def encode(self) -> bytes:
        """The frame's exact bytes on the wire."""
        return self.line().encode("utf-8") + b"\n"

    @classmethod
    def from_parsed(cls: type[R], parsed: ParsedLine, payload: bytes | None) -> R:
        raise NotImplementedError

    @classmethod
    def decode(
        cls: type[R], header: bytes | str, payload: bytes | None = None, *, strict: bool = True
    ) -> R:
        """The record of one header line (LF optional) and its payload, if the kind has one;
        ``ProtocolViolation`` when the line is not this kind or breaks its grammar."""
        parsed = parse_line(header, direction=cls.DIRECTION, strict=strict)
        text = header if isinstance(header, str) else header.decode("utf-8", "replace")
        if parsed is None or parsed.kind != cls.KIND:
            raise ProtocolViolation(cls.KIND, "not a line of this kind", text)
        return cls.from_line(parsed, text, payload)

    @classmethod
    def from_line(cls: type[R], parsed: ParsedLine, text: str, payload: bytes | None) -> R:
        """The record of an already parsed line (its payload checked against the header)."""
        if parsed.spec.payload is not None:
            want = parsed.payload_length
            if payload is None or len(payload) != want:
                got = "none" if payload is None else str(len(payload))
                raise ProtocolViolation(cls.KIND, f"payload of {got} bytes, header says {want}",
                                        text)
        return cls.from_parsed(parsed, payload)


def _i(parsed: ParsedLine, name: str) -> int:
    return parsed.get_int(name)


def _f(parsed: ParsedLine, name: str) -> float:
    return parsed.get_float(name)


def _opt_i(parsed: ParsedLine, name: str) -> int | None:
    value = parsed.values.get(name)
    return value if isinstance(value, int) else None


def _groups(parsed: ParsedLine, name: str) -> list[dict[str, Any]]:
    value = parsed.values.get(name)
    return value if isinstance(value, list) else []


@dataclass(frozen=True)
class Ready(Record):
    KIND: ClassVar[str] = "READY"

    def line(self) -> str:
        return SPEC.sentinel("READY").decode("latin-1")

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Ready:
        return cls()


@dataclass(frozen=True)
class End(Record):
    KIND: ClassVar[str] = "END"

    def line(self) -> str:
        return SPEC.sentinel("END").decode("latin-1")

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> End:
        return cls()


@dataclass(frozen=True)
class Stat(Record):
    """STAT: after READY (all zero but RSS) and at a legacy turn's end (with the turn's two)."""

    KIND: ClassVar[str] = "STAT"
    produced: int
    tok_s: float
    hit_pct: float
    rss_gb: float
    prompt_tokens: int | None = None
    length_limited: bool | None = None

    def line(self) -> str:
        text = f"STAT {self.produced} {f2(self.tok_s)} {f1(self.hit_pct)} {f2(self.rss_gb)}"
        if self.prompt_tokens is not None:
            text += f" {self.prompt_tokens} {int(bool(self.length_limited))}"
        return text

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Stat:
        limited = _opt_i(parsed, "length_limited")
        return cls(_i(parsed, "produced"), _f(parsed, "tok_s"), _f(parsed, "hit_pct"),
                   _f(parsed, "rss_gb"), _opt_i(parsed, "prompt_tokens"),
                   None if limited is None else bool(limited))


@dataclass(frozen=True)
class Caps(Record):
    """CAPS: the capability announcement, keys in the order given."""

    KIND: ClassVar[str] = "CAPS"
    caps: tuple[tuple[str, int], ...]

    def line(self) -> str:
        return "CAPS" + "".join(f" {key}={value}" for key, value in self.caps)

    def as_dict(self) -> dict[str, int]:
        return dict(self.caps)

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Caps:
        pairs = []
        for group in _groups(parsed, "caps"):
            key, _, value = str(group["capability"]).partition("=")
            pairs.append((key, int(value)))
        return cls(tuple(pairs))


@dataclass(frozen=True)
class HwInfo(Record):
    """HWINFO: the host and its accelerators; the last field is ``<cpu>|<gpu>`` free text."""

    KIND: ClassVar[str] = "HWINFO"
    cores: int
    ram_total_gb: float
    ram_avail_gb: float
    ngpu: int
    vram_total_gb: float
    cpu: str
    gpu: str

    def line(self) -> str:
        return (f"HWINFO {self.cores} {f1(self.ram_total_gb)} {f1(self.ram_avail_gb)} "
                f"{self.ngpu} {f1(self.vram_total_gb)} {self.cpu}|{self.gpu}")

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> HwInfo:
        cpu, _, gpu = str(parsed.values["cpu_gpu"]).partition("|")
        return cls(_i(parsed, "cores"), _f(parsed, "ram_total_gb"), _f(parsed, "ram_avail_gb"),
                   _i(parsed, "ngpu"), _f(parsed, "vram_total_gb"), cpu, gpu)


@dataclass(frozen=True)
class GpuDevice:
    used_gb: float
    total_gb: float
    experts: int


@dataclass(frozen=True)
class Gpus(Record):
    """GPUS: per device VRAM used/total GB and resident experts."""

    KIND: ClassVar[str] = "GPUS"
    devices: tuple[GpuDevice, ...]

    def line(self) -> str:
        parts = [f"GPUS {len(self.devices)}"]
        parts.extend(f"{f3(d.used_gb)} {f3(d.total_gb)} {d.experts}" for d in self.devices)
        return " ".join(parts)

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Gpus:
        return cls(tuple(GpuDevice(float(g["used_gb"]), float(g["total_gb"]), int(g["experts"]))
                         for g in _groups(parsed, "devices")))


@dataclass(frozen=True)
class Tiers(Record):
    KIND: ClassVar[str] = "TIERS"
    vram: int
    ram: int
    disk: int
    vram_gb: float
    ram_gb: float

    def line(self) -> str:
        return (f"TIERS {self.vram} {self.ram} {self.disk} {f2(self.vram_gb)} "
                f"{f2(self.ram_gb)}")

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Tiers:
        return cls(_i(parsed, "vram"), _i(parsed, "ram"), _i(parsed, "disk"),
                   _f(parsed, "vram_gb"), _f(parsed, "ram_gb"))


@dataclass(frozen=True)
class Emap(Record):
    """EMAP: one byte per expert, (tier << 6) | heat, row-major."""

    KIND: ClassVar[str] = "EMAP"
    rows: int
    cols: int
    map: bytes

    def line(self) -> str:
        return f"EMAP {self.rows} {self.cols} {self.map.hex()}"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Emap:
        return cls(_i(parsed, "rows"), _i(parsed, "cols"), bytes.fromhex(str(parsed.values["map"])))


@dataclass(frozen=True)
class Hits(Record):
    """HITS: the bitmap of experts routed since the previous HITS (LSB first)."""

    KIND: ClassVar[str] = "HITS"
    rows: int
    cols: int
    bits: bytes

    def line(self) -> str:
        return f"HITS {self.rows} {self.cols} {self.bits.hex()}"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Hits:
        return cls(_i(parsed, "rows"), _i(parsed, "cols"),
                   bytes.fromhex(str(parsed.values["bits"])))


@dataclass(frozen=True)
class Entropy(Record):
    KIND: ClassVar[str] = "ENTROPY"
    layers: tuple[float, ...]

    def line(self) -> str:
        return "ENTROPY" + "".join(f" {f3(h)}" for h in self.layers)

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Entropy:
        return cls(tuple(float(g["bits"]) for g in _groups(parsed, "layers")))


@dataclass(frozen=True)
class Perf(Record):
    """PERF: a turn's decode time and its phases, in seconds."""

    KIND: ClassVar[str] = "PERF"
    id: int
    dt: float
    t_edisk: float
    t_ewait: float
    t_emm: float
    t_attn: float
    t_kvb: float
    t_head: float

    def line(self) -> str:
        return (f"PERF {self.id} {f6(self.dt)} {f6(self.t_edisk)} {f6(self.t_ewait)} "
                f"{f6(self.t_emm)} {f6(self.t_attn)} {f6(self.t_kvb)} {f6(self.t_head)}")

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Perf:
        return cls(_i(parsed, "id"), *(_f(parsed, n) for n in PERF_TIMES))


PERF_TIMES = ("dt", "t_edisk", "t_ewait", "t_emm", "t_attn", "t_kvb", "t_head")


@dataclass(frozen=True)
class Prof(Record):
    """PROF in colibri's newest 17-field form."""

    KIND: ClassVar[str] = "PROF"
    wall_s: float
    prompt_tokens: int
    completion_tokens: int
    edisk_s: float
    ewait_s: float
    emm_s: float
    attn_s: float
    head_s: float
    forwards: int
    fwd_p50_ms: float
    fwd_p99_ms: float
    physical_bytes: int
    rammap_experts: int
    rammap_bytes: int
    ttft_ms: float
    prefault_s: float
    physical_valid: bool

    def line(self) -> str:
        return (
            f"PROF {f3(self.wall_s)} {self.prompt_tokens} {self.completion_tokens} "
            f"{f3(self.edisk_s)} {f3(self.ewait_s)} {f3(self.emm_s)} {f3(self.attn_s)} "
            f"{f3(self.head_s)} {self.forwards} {f3(self.fwd_p50_ms)} {f3(self.fwd_p99_ms)} "
            f"{self.physical_bytes} {self.rammap_experts} {self.rammap_bytes} "
            f"{f3(self.ttft_ms)} {f3(self.prefault_s)} {int(self.physical_valid)}"
        )

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Prof:
        v = parsed
        return cls(_f(v, "wall_s"), _i(v, "prompt_tokens"), _i(v, "completion_tokens"),
                   _f(v, "edisk_s"), _f(v, "ewait_s"), _f(v, "emm_s"), _f(v, "attn_s"),
                   _f(v, "head_s"), _i(v, "forwards"), _f(v, "fwd_p50_ms"),
                   _f(v, "fwd_p99_ms"), _i(v, "physical_bytes"), _i(v, "rammap_experts"),
                   _i(v, "rammap_bytes"), _f(v, "ttft_ms"), _f(v, "prefault_s"),
                   bool(_i(v, "physical_valid")))


@dataclass(frozen=True)
class Repin(Record):
    KIND: ClassVar[str] = "REPIN"
    layer: int
    eid: int
    old_tier: int
    gpu: int

    def line(self) -> str:
        return f"REPIN {self.layer} {self.eid} {self.old_tier} {self.gpu}"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Repin:
        return cls(_i(parsed, "layer"), _i(parsed, "eid"), _i(parsed, "old_tier"),
                   _i(parsed, "gpu"))


@dataclass(frozen=True)
class NodeResidency:
    experts: int
    resident_gb: float


@dataclass(frozen=True)
class Nodes(Record):
    """NODES (this project's extension, with ``--cluster``): each routed expert's owner, one
    byte per expert over EMAP's rows and columns (0xff: none), then per expert worker the
    experts it holds and its resident GB."""

    KIND: ClassVar[str] = "NODES"
    rows: int
    cols: int
    map: bytes
    nodes: tuple[NodeResidency, ...]

    def line(self) -> str:
        parts = [f"NODES {self.rows} {self.cols} {self.map.hex()} {len(self.nodes)}"]
        parts.extend(f"{n.experts} {f3(n.resident_gb)}" for n in self.nodes)
        return " ".join(parts)

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Nodes:
        return cls(_i(parsed, "rows"), _i(parsed, "cols"), bytes.fromhex(str(parsed.values["map"])),
                   tuple(NodeResidency(int(g["experts"]), float(g["resident_gb"]))
                         for g in _groups(parsed, "nodes")))


@dataclass(frozen=True)
class Accept(Record):
    KIND: ClassVar[str] = "ACCEPT"
    id: int
    prompt_tokens: int

    def line(self) -> str:
        return f"ACCEPT {self.id} {self.prompt_tokens}"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Accept:
        return cls(_i(parsed, "id"), _i(parsed, "prompt_tokens"))


@dataclass(frozen=True)
class Logprobs:
    """A DATA/ECHO tail: the token's logprob and the ``(id, logprob)`` top-k table."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()

    def tail(self) -> str:
        """``" %.6f %d"`` then ``" %d %.6f"`` per table entry."""
        parts = [f" {logprob(self.logprob)} {len(self.top)}"]
        parts.extend(f" {token} {logprob(lp)}" for token, lp in self.top)
        return "".join(parts)

    @classmethod
    def from_parsed(cls, parsed: ParsedLine) -> Logprobs | None:
        if "logprob" not in parsed.values:
            return None
        top = tuple((int(g["token"]), float(g["logprob"])) for g in _groups(parsed, "top"))
        return cls(_f(parsed, "logprob"), top)


#: ECHO position 0 has no predictor: its tail is ``nan 0``.
NO_PREDICTOR = Logprobs(math.nan)


@dataclass(frozen=True)
class Data(Record):
    """DATA: one generated token's bytes, with its logprobs when the request asked."""

    KIND: ClassVar[str] = "DATA"
    id: int
    payload: bytes
    logprobs: Logprobs | None = None

    def line(self) -> str:
        tail = self.logprobs.tail() if self.logprobs is not None else ""
        return f"DATA {self.id} {len(self.payload)}{tail}"

    def encode(self) -> bytes:
        return self.line().encode("ascii") + b"\n" + self.payload + b"\n"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Data:
        return cls(_i(parsed, "id"), payload or b"", Logprobs.from_parsed(parsed))


@dataclass(frozen=True)
class Echo(Record):
    """ECHO: one prompt position's bytes and logprobs (``logprob=1``, echo requests)."""

    KIND: ClassVar[str] = "ECHO"
    id: int
    payload: bytes
    pos: int
    logprobs: Logprobs

    def line(self) -> str:
        return f"ECHO {self.id} {len(self.payload)} {self.pos}{self.logprobs.tail()}"

    def encode(self) -> bytes:
        return self.line().encode("ascii") + b"\n" + self.payload + b"\n"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Echo:
        logprobs = Logprobs.from_parsed(parsed)
        assert logprobs is not None
        return cls(_i(parsed, "id"), payload or b"", _i(parsed, "pos"), logprobs)


@dataclass(frozen=True)
class Topk(Record):
    """TOPK: the most likely next tokens as ``(logprob, bytes)``."""

    KIND: ClassVar[str] = "TOPK"
    id: int
    candidates: tuple[tuple[float, bytes], ...]

    def line(self) -> str:
        parts = [f"TOPK {self.id} {len(self.candidates)}"]
        parts.extend(f"{f6(lp)} {_hextext(text)}" for lp, text in self.candidates)
        return " ".join(parts)

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Topk:
        return cls(_i(parsed, "id"), tuple(
            (float(g["logprob"]), _unhextext(str(g["text"])))
            for g in _groups(parsed, "candidates")))


@dataclass(frozen=True)
class Done(Record):
    """DONE: a request's success, with STAT's numbers for its turn."""

    KIND: ClassVar[str] = "DONE"
    id: int
    emitted: int
    tok_s: float
    hit_pct: float
    rss_gb: float
    prompt_tokens: int
    length_limited: bool

    def line(self) -> str:
        return (f"DONE {self.id} STAT {self.emitted} {f2(self.tok_s)} {f1(self.hit_pct)} "
                f"{f2(self.rss_gb)} {self.prompt_tokens} {int(self.length_limited)}")

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Done:
        return cls(_i(parsed, "id"), _i(parsed, "emitted"), _f(parsed, "tok_s"),
                   _f(parsed, "hit_pct"), _f(parsed, "rss_gb"), _i(parsed, "prompt_tokens"),
                   bool(_i(parsed, "length_limited")))


@dataclass(frozen=True)
class Error(Record):
    """ERROR: a request's failure (id 0: a line no request owns); CONTEXT_EXCEEDED adds the
    prompt's token count and the limit."""

    KIND: ClassVar[str] = "ERROR"
    id: int
    code: str
    prompt_tokens: int | None = None
    limit: int | None = None

    def line(self) -> str:
        text = f"ERROR {self.id} {self.code}"
        if self.prompt_tokens is not None:
            text += f" {self.prompt_tokens} {self.limit}"
        return text

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Error:
        return cls(_i(parsed, "id"), str(parsed.values["code"]), _opt_i(parsed, "prompt_tokens"),
                   _opt_i(parsed, "limit"))


# --- the server-to-engine direction -----------------------------------------------------


@dataclass(frozen=True)
class SubmitRequest:
    """What a SUBMIT asks for, before it has an id (the server builds these)."""

    slot: int
    payload: bytes
    max_tokens: int
    temperature: float
    top_p: float
    grammar: bytes = b""
    extensions: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Submit(Record):
    """SUBMIT: a request with its id; gbytes is written whenever there is a grammar or an
    extension."""

    KIND: ClassVar[str] = "SUBMIT"
    DIRECTION: ClassVar[str] = "server"
    id: int
    request: SubmitRequest

    def line(self) -> str:
        r = self.request
        head = (f"SUBMIT {self.id} {r.slot} {len(r.payload)} {r.max_tokens} "
                f"{g8(r.temperature)} {g8(r.top_p)}")
        if r.grammar or r.extensions:
            head += f" {len(r.grammar)}"
            for key, value in r.extensions.items():
                head += f" {key}={value}"
        return head

    def encode(self) -> bytes:
        r = self.request
        return self.line().encode("ascii") + b"\n" + r.payload + r.grammar + b"\n"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Submit:
        body = payload or b""
        nbytes = _i(parsed, "bytes")
        extensions = {}
        for g in _groups(parsed, "extensions"):
            key, _, value = str(g["extension"]).partition("=")
            extensions[key] = int(value)
        request = SubmitRequest(_i(parsed, "slot"), body[:nbytes], _i(parsed, "max_tokens"),
                                _f(parsed, "temperature"), _f(parsed, "top_p"), body[nbytes:],
                                extensions)
        return cls(_i(parsed, "id"), request)


@dataclass(frozen=True)
class _RequestCommand(Record):
    """A command that names one request and nothing else (``KIND <id>``)."""

    DIRECTION: ClassVar[str] = "server"
    id: int

    def line(self) -> str:
        return f"{self.KIND} {self.id}"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Self:
        return cls(_i(parsed, "id"))


@dataclass(frozen=True)
class Stop(_RequestCommand):
    KIND: ClassVar[str] = "STOP"


@dataclass(frozen=True)
class Cancel(_RequestCommand):
    KIND: ClassVar[str] = "CANCEL"


@dataclass(frozen=True)
class _ExactLine(Record):
    """A legacy command that is one exact line with no fields (its text is the spec's)."""

    DIRECTION: ClassVar[str] = "server"

    def line(self) -> str:
        exact = SPEC.request_lines[self.KIND].exact
        assert exact is not None
        return exact

    @classmethod
    def from_parsed(cls: type[R], parsed: ParsedLine, payload: bytes | None) -> R:
        return cls()


@dataclass(frozen=True)
class Reset(_ExactLine):
    KIND: ClassVar[str] = "RESET"


@dataclass(frozen=True)
class More(_ExactLine):
    KIND: ClassVar[str] = "MORE"


@dataclass(frozen=True)
class Prompt(Record):
    """The legacy ``\\x02PROMPT`` API frame."""

    KIND: ClassVar[str] = "PROMPT"
    DIRECTION: ClassVar[str] = "server"
    payload: bytes
    max_tokens: int
    temperature: float
    top_p: float
    kv_slot: int | None = None

    def line(self) -> str:
        head = (f"\x02PROMPT {len(self.payload)} {self.max_tokens} {g8(self.temperature)} "
                f"{g8(self.top_p)}")
        if self.kv_slot is not None:
            head += f" {self.kv_slot}"
        return head

    def encode(self) -> bytes:
        return self.line().encode("ascii") + b"\n" + self.payload + b"\n"

    @classmethod
    def from_parsed(cls, parsed: ParsedLine, payload: bytes | None) -> Prompt:
        return cls(payload or b"", _i(parsed, "max_tokens"), _f(parsed, "temperature"),
                   _f(parsed, "top_p"), _opt_i(parsed, "kv_slot"))


ENGINE_RECORDS: dict[str, type[Record]] = {
    r.KIND: r for r in (Ready, End, Stat, Caps, HwInfo, Gpus, Tiers, Emap, Hits, Entropy, Perf,
                        Prof, Repin, Nodes, Accept, Data, Echo, Topk, Done, Error)
}
REQUEST_RECORDS: dict[str, type[Record]] = {
    r.KIND: r for r in (Submit, Stop, Cancel, Reset, More, Prompt)
}


def decode(
    header: bytes | str,
    payload: bytes | None = None,
    direction: str = "engine",
    *,
    strict: bool = True,
) -> Record | None:
    """The record of a line of either direction; None for a kind protocol.json does not
    define (the forward-compatibility rule), ``ProtocolViolation`` for a malformed known one."""
    parsed = parse_line(header, direction=direction, strict=strict)
    if parsed is None:
        return None
    table = ENGINE_RECORDS if direction == "engine" else REQUEST_RECORDS
    text = header if isinstance(header, str) else header.decode("utf-8", "replace")
    return table[parsed.kind].from_line(parsed, text, payload)
