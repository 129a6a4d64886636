"""The serve_codec double: the reference engine behind colibri's family-engine dialect.

colibri's family engines (glm53, mimo, inkling, the qwen engines, kimi_k3, dsv4) read and
write frames through one shared codec, ``c/serve_codec.h``, whose dialect is not the GLM
engine's (spec/protocol.md §5). This proxy speaks that dialect on its own stdin/stdout and the
GLM dialect to ``colibri engine`` behind it:

- it reads every command with the codec's rules itself, because the two dialects refuse
  different headers and drain different bytes: only a SUBMIT the codec accepts reaches the
  engine, rewritten with a fresh numeric id (§5.1), its keys after an explicit gbytes 0, its
  extension section and prefix hint left out (their meaning is each family's own, §5.2);
- its wire profile has every switch on: extension bytes, the prefix hint, finite sampling,
  an exact LF (``PROFILE``);
- on the way back ids become the strings they stand for, the handshake STAT and DONE take the
  codec's formats (§5.5), and the GLM-only CAPS and ECHO lines are dropped.

Run as ``mutant_proxy.py serve_codec ENGINE-ARGV...``. The ``serve_codec_*`` modes are
mutants that break one rule each (MODES); tests/conformance/test_serve_codec_profile.py
checks that the suite's serve_codec cases pass on the double and catch each mutant.
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import threading
from dataclasses import dataclass, field

from colibri.conformance.frames import Frame, FrameSplitter

MODES = {
    "serve_codec": "speaks colibri's serve_codec dialect (spec/protocol.md §5) in front of "
    "the reference engine",
    "serve_codec_numeric_ids": "the serve_codec double refusing ids that are not decimal, as "
    "the GLM dialect does",
    "serve_codec_done_2f": "the serve_codec double writing DONE's tok/s with two decimals",
    "serve_codec_unknown_refused": "the serve_codec double answering unknown commands "
    "ERROR 0 BAD_REQUEST instead of ignoring them",
    "serve_codec_long_ids": "the serve_codec double taking ids of 64 bytes",
}


@dataclass(frozen=True)
class WireProfile:
    """The switches and limits a family engine gives the codec (ColiServeWireProfile)."""

    max_header_bytes: int = 4096
    # The reference engine's own limits (protocol.md §2.2): nothing larger could reach it.
    max_payload_bytes: int = 16 << 20
    max_extension_bytes: int = 1 << 20
    exact_lf: bool = True
    finite_sampling: bool = True
    extension_bytes: bool = True
    prefix_hint: bool = True


PROFILE = WireProfile()

#: The codec stores ids in 64 bytes with their NUL: 63 bytes at most.
ID_CAP = 64
MAX_FIELDS = 10
VERBS = (b"SUBMIT", b"STOP", b"CANCEL", b"IMAGE")
#: Keys the codec's key rules know (decode_batch.h) and their largest values.
KEY_MAX = {b"logprobs": 32, b"ids": 1, b"pin": 1}
#: The key part is copied into a 128-byte buffer, one blank before each token.
KEY_BUFFER = 128
FLT_MAX = 3.4028234663852886e38
_BLANKS = re.compile(rb"[^ \t]+")
_INT = re.compile(rb"[+-]?[0-9]+")
_UINT = re.compile(rb"\+?[0-9]+")
# What strtof reads whole, less hex floats (no gateway writes one).
_FLOAT = re.compile(
    rb"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)", re.I
)
_KEY = re.compile(rb"([a-z_]{1,15})=([0-9]+)")
#: Refusals (what the codec's reader returns besides a command).
OK, IGNORED, BAD_REQUEST, BAD_FRAME, EOF = "ok", "ignored", "bad_request", "bad_frame", "eof"


@dataclass
class Command:
    result: str
    kind: bytes = b""
    #: The id as the codec keeps it: empty when missing or too long (answered as 0).
    rid: bytes = b""
    fields: list[bytes] = field(default_factory=list)
    payload: bytes = b""
    keys: dict[bytes, int] = field(default_factory=dict)


class Input:
    """Bytes from a file descriptor, read as the codec reads them: lines, counts, one byte."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.buffer = bytearray()

    def _more(self) -> bool:
        chunk = os.read(self.fd, 65536)
        self.buffer += chunk
        return bool(chunk)

    def line(self, limit: int) -> tuple[bytes, str]:
        """The next line without its LF, and OK, BAD_REQUEST (longer than `limit`: the
        first `limit` bytes, the rest drained to the LF), BAD_FRAME (cut by EOF) or EOF."""
        scanned = 0
        while (newline := self.buffer.find(b"\n", scanned)) < 0:
            scanned = len(self.buffer)
            if not self._more():
                rest = bytes(self.buffer)
                self.buffer.clear()
                if len(rest) > limit:
                    return rest[:limit], BAD_REQUEST
                return rest, BAD_FRAME if rest else EOF
        line = bytes(self.buffer[:newline])
        del self.buffer[: newline + 1]
        return (line[:limit], BAD_REQUEST) if len(line) > limit else (line, OK)

    def exact(self, count: int) -> bytes | None:
        while len(self.buffer) < count:
            if not self._more():
                return None
        data = bytes(self.buffer[:count])
        del self.buffer[:count]
        return data


def _classify(line: bytes, id_cap: int) -> tuple[bytes, bytes]:
    """Kind and id from the start of a line, also one refused before its fields are split
    (an over-long line), so that the refusal can name the request."""
    words = _BLANKS.findall(line)
    kind = words[0] if words and words[0] in VERBS else b""
    rid = words[1] if kind and len(words) > 1 and len(words[1]) < id_cap else b""
    return kind, rid


def _i32(text: bytes) -> int | None:
    value = int(text) if _INT.fullmatch(text) else None
    return value if value is not None and -(2**31) <= value < 2**31 else None


def _u64(text: bytes) -> int | None:
    value = int(text) if _UINT.fullmatch(text) else None
    return value if value is not None and value < 2**64 else None


def _f32(text: bytes) -> float | None:
    if not _FLOAT.fullmatch(text):
        return None
    value = float(text)
    # strtof overflows to infinity where a double would still be finite.
    return math.copysign(math.inf, value) if abs(value) > FLT_MAX else value


def _keys(tokens: list[bytes]) -> dict[bytes, int] | None:
    """The key=value part, by the codec's key rules; None refuses the header."""
    used = 0
    found: dict[bytes, int] = {}
    for token in tokens:
        if used + len(token) + 2 >= KEY_BUFFER:
            return None
        used += len(token) + 1
        match = _KEY.fullmatch(token)
        if match is None or match[1] not in KEY_MAX or match[1] in found:
            return None
        if int(match[2]) > KEY_MAX[match[1]]:
            return None
        found[match[1]] = int(match[2])
    return found


def read_command(source: Input, profile: WireProfile, mode: str) -> Command:
    """One command, the way coli_serve_read_command reads it (spec/protocol.md §5.1-§5.3)."""
    id_cap = ID_CAP + 1 if mode == "serve_codec_long_ids" else ID_CAP
    line, status = source.line(profile.max_header_bytes)
    if status == EOF:
        return Command(EOF)
    # One trailing CR is not part of the line, and C strings end at the first NUL.
    if status == OK and line.endswith(b"\r"):
        line = line[:-1]
    line = line.split(b"\0", 1)[0]
    kind, rid = _classify(line, id_cap)
    if status != OK:
        return Command(status, kind, rid)
    fields = _BLANKS.findall(line)
    if len(fields) > MAX_FIELDS:
        return Command(BAD_REQUEST, kind, rid)
    if not fields or fields[0] not in VERBS:
        return Command(IGNORED)
    if len(fields) < 2 or len(fields[1]) >= id_cap:
        return Command(BAD_REQUEST, kind, rid)
    if mode == "serve_codec_numeric_ids" and not fields[1].isdigit():
        return Command(BAD_REQUEST)  # the GLM dialect cannot read the id: ERROR 0
    command = Command(OK, kind, rid, fields)
    if kind in (b"STOP", b"CANCEL"):
        return command if len(fields) == 2 else Command(BAD_REQUEST, kind, rid)
    if kind == b"IMAGE":
        return _read_image(source, profile, command)
    return _read_submit(source, profile, command)


def _read_image(source: Input, profile: WireProfile, command: Command) -> Command:
    fields = command.fields
    size = _u64(fields[2]) if len(fields) == 5 else None
    grid = [_i32(f) for f in fields[3:5]]
    if size is None or size > profile.max_payload_bytes or any(g is None or g < 1 for g in grid):
        command.result = BAD_REQUEST
        return command
    # Always consumed: left in the stream, image bytes would be read as headers.
    payload = source.exact(size)
    end = source.exact(1)
    if end == b"\r":
        end = source.exact(1)
    command.result = OK if payload is not None and end == b"\n" else BAD_FRAME
    return command


def _read_submit(source: Input, profile: WireProfile, command: Command) -> Command:
    fields = command.fields
    # The first field from the 8th on with '=' opens the key part; the rest are positional.
    positional = next((i for i in range(7, len(fields)) if b"=" in fields[i]), len(fields))
    keys = _keys(fields[positional:]) if positional < len(fields) else {}
    widest = 7 + profile.extension_bytes + profile.prefix_hint
    if (
        keys is None
        or not 7 <= positional <= widest
        or (positional >= 8 and not profile.extension_bytes)
        or (positional >= 9 and not (profile.prefix_hint and profile.extension_bytes))
    ):
        command.result = BAD_REQUEST
        return command
    slot, size, max_tokens = _i32(fields[2]), _u64(fields[3]), _i32(fields[4])
    temperature, top_p = _f32(fields[5]), _f32(fields[6])
    extension = _u64(fields[7]) if positional >= 8 else 0
    prefix = _i32(fields[8]) if positional >= 9 else 0
    logprobs = keys.get(b"logprobs", 0)
    if (
        slot is None or size is None or max_tokens is None or temperature is None
        or top_p is None or extension is None or prefix is None
        or size > profile.max_payload_bytes
        or extension > profile.max_extension_bytes
        or (max_tokens < 1 and not (max_tokens == 0 and logprobs > 0))
        or (profile.finite_sampling and not (math.isfinite(temperature)
                                             and math.isfinite(top_p)))
    ):
        command.result = BAD_REQUEST
        return command
    payload = source.exact(size)
    section = source.exact(extension)
    end = source.exact(1)
    if payload is None or section is None or end is None or (
        profile.exact_lf and end != b"\n"
    ):
        command.result = BAD_FRAME
        return command
    command.payload, command.keys = payload, keys
    return command


class Double:
    def __init__(self, mode: str, argv: list[str]) -> None:
        self.mode = mode
        env = dict(os.environ)
        # A family engine has no STATS dump (the GLM engine's): the suite's probe must not
        # find one behind the double.
        env.pop("STATS", None)
        self.engine = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                       bufsize=0, env=env)
        self.out = sys.stdout.buffer
        self.lock = threading.Lock()
        self.numbers: dict[bytes, int] = {}  # string id -> its latest number
        self.names: dict[int, bytes] = {}
        self.active: set[int] = set()  # ACCEPTed numbers without DONE or CANCELLED yet
        self.issued = 0
        self.seen_stat = False

    def reply(self, data: bytes) -> None:
        with self.lock:
            self.out.write(data)
            self.out.flush()

    def number(self, rid: bytes, submit: bool) -> int:
        """The engine's id for a string id: a fresh number for every new request, the same one
        for a request that is still active (so the engine, not the double, answers a duplicate
        SLOT_BUSY or DUPLICATE_ID) and for STOP or CANCEL of a known id. A duplicate sent
        before the first one's ACCEPT came back gets a number of its own."""
        with self.lock:
            known = self.numbers.get(rid)
            if known is not None and (not submit or known in self.active):
                return known
            self.issued += 1
            self.numbers[rid] = self.issued
            self.names[self.issued] = rid
            return self.issued

    # -- server -> engine ------------------------------------------------------------------
    def pump_input(self) -> None:
        source = Input(sys.stdin.buffer.fileno())
        sink = self.engine.stdin
        assert sink is not None
        try:
            while True:
                command = read_command(source, PROFILE, self.mode)
                if command.result == EOF:
                    break
                if command.result == IGNORED:
                    if self.mode == "serve_codec_unknown_refused":
                        self.reply(b"ERROR 0 BAD_REQUEST\n")
                    continue
                if command.result != OK:
                    code = b"BAD_FRAME" if command.result == BAD_FRAME else b"BAD_REQUEST"
                    self.reply(b"ERROR " + (command.rid or b"0") + b" " + code + b"\n")
                    if command.result == BAD_FRAME:
                        break  # the stream is no longer aligned on a header
                    continue
                forwarded = self.forward(command)
                if forwarded is None:
                    self.reply(b"ERROR " + command.rid + b" BAD_REQUEST\n")
                else:
                    sink.write(forwarded)
        except (BrokenPipeError, OSError):
            pass
        try:
            sink.close()  # EOF: the engine finishes what is active, then exits
        except OSError:
            pass

    def forward(self, command: Command) -> bytes | None:
        """The command in the GLM dialect, or None when the engine has nothing to do with it
        (an image: it has no vision) or could not be told it (a negative slot, a non-finite
        value: its grammar has no spelling for them)."""
        fields = command.fields
        if command.kind in (b"STOP", b"CANCEL"):
            return b"%s %d\n" % (command.kind, self.number(command.rid, submit=False))
        if command.kind == b"IMAGE":
            return None
        slot, temperature, top_p = int(fields[2]), _f32(fields[5]), _f32(fields[6])
        assert temperature is not None and top_p is not None
        if slot < 0 or not (math.isfinite(temperature) and math.isfinite(top_p)):
            return None
        # `ids` is read but the codec's command has no field for it: payloads stay text.
        keys = b"".join(b" %s=%d" % (k, v) for k, v in command.keys.items() if k != b"ids")
        header = b"SUBMIT %d %d %d %d %s %s" % (
            self.number(command.rid, submit=True), slot, len(command.payload),
            int(fields[4]), b"%.9g" % temperature, b"%.9g" % top_p,
        )
        return header + (b" 0" + keys if keys else b"") + b"\n" + command.payload + b"\n"

    # -- engine -> server ------------------------------------------------------------------
    def pump_output(self) -> None:
        stream = self.engine.stdout
        assert stream is not None
        splitter = FrameSplitter()
        while chunk := os.read(stream.fileno(), 65536):
            self.reply(b"".join(self.translate(f) for f in splitter.feed(chunk)))
        self.reply(b"".join(self.translate(f) for f in splitter.finish()))

    def translate(self, frame: Frame) -> bytes:
        if frame.kind in ("CAPS", "ECHO"):
            return b""  # GLM-dialect lines: no codec writer sends them
        parts = frame.header.split(b" ")
        if frame.kind == "STAT" and not self.seen_stat:
            self.seen_stat = True
            return b"STAT 0 0.0 0.0 %s 0 0\n" % parts[-1]
        number = frame.request_id
        if not number:
            return frame.wire()
        with self.lock:
            if frame.kind == "ACCEPT":
                self.active.add(number)
            elif frame.kind == "DONE" or (frame.kind == "ERROR" and b"CANCELLED" in parts):
                self.active.discard(number)
            name = self.names.get(number)
        if name is None:
            return frame.wire()
        parts[1] = name
        if frame.kind == "DONE":
            parts[4] = b"%.*f" % (2 if self.mode == "serve_codec_done_2f" else 3, float(parts[4]))
        header = b" ".join(parts) + b"\n"
        return header if frame.payload is None else header + frame.payload + b"\n"

    def run(self) -> int:
        threading.Thread(target=self.pump_input, daemon=True).start()
        self.pump_output()
        return self.engine.wait()


def main(mode: str, argv: list[str]) -> int:
    return Double(mode, argv).run()
