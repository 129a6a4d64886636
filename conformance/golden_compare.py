"""Compare an engine's or a server's output with a stored golden copy (spec/model.md §15).

Everything is compared exactly (kind (a)) except the numeric fields of kind (b) that the
spec names, which are compared within the model's tolerance (:mod:`.sameness`):

- **Engine frames** are parsed by their grammar in spec/protocol.json (through
  :mod:`colibri.protocol`, the one reader of the wire spec). A scalar field of type
  ``logprob`` is kind (b), compared within ``printed(tolerance.logprob, decimals)``; a
  repeated group holding a ``logprob`` field is a top-k table, compared tie-aware with
  :func:`.sameness.ranking_difference`, its other fields being the candidate's identity.
  Every other field, payload bytes included, is exact: ENTROPY is the entropy of integer
  counts of routing choices (``fixed3``), so it is kind (a), not a logit entropy.
- **HTTP bodies and SSE events** are walked along their JSON schema (spec/schemas). A number
  whose schema carries ``"x-colibri-sameness": "logprob"`` is kind (b); an array or map whose
  schema carries ``"x-colibri-sameness": "ranking"`` is a top-k table. Anything else is exact,
  numbers included (a number the schema does not name is never given a tolerance).

Top-k tables of DATA/ECHO (and the HTTP tables built from them) are in colibri's slot order
(spec/model.md §13), which follows comparisons among logits that are not in the table, so a
perturbation of kind (b) may permute it: they are compared in presentation order (descending
logprob, ties by ascending identity). TOPK is sorted by the engine; its order is compared as
sent, and the actual table must itself be non-increasing.

Nothing is rounded and nothing is found by a regex over text: a value is compared only
where the grammar or the schema puts a logprob.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import jsonschema
import referencing
from colibri.conformance.sameness import Tolerance, printed, ranking_difference
from referencing.jsonschema import DRAFT202012

from colibri import resources
from colibri.protocol import ProtocolSpec, ProtocolViolation, load_spec, parse_line

#: The JSON-schema annotation that names kind-(b) fields and top-k tables.
SAMENESS_KEY = "x-colibri-sameness"
#: The protocol.json type of kind-(b) fields.
LOGPROB_TYPE = "logprob"
#: Where a transcript line's header ends and its payload starts (tests' normalised form).
PAYLOAD_SEPARATOR = " | "

#: Order of each top-k table of the grammar: "slot" (colibri's unsorted slot order,
#: spec/protocol.md 2.5) or "descending" (sorted by the engine). Every repeated group with a
#: logprob field must be listed: an unknown table fails loudly instead of being compared
#: in a guessed order.
TABLE_ORDER: Mapping[tuple[str, str], str] = {
    ("DATA", "top"): "slot",
    ("ECHO", "top"): "slot",
    ("TOPK", "candidates"): "descending",
}

_SCHEMA_BASE = "https://spec.colibri.invalid/schemas/"

Id = int | str


@dataclass(frozen=True)
class Mismatch:
    """One difference: where it is, what was seen and expected, and the rule applied."""

    where: str
    actual: str
    expected: str
    rule: str

    def __str__(self) -> str:
        return f"{self.where}: got {self.actual}, expected {self.expected} ({self.rule})"


@dataclass
class Comparison:
    """The outcome of one comparison: mismatches, and the largest kind-(b) differences."""

    mismatches: list[Mismatch] = field(default_factory=list)
    #: quantity (e.g. "DATA.logprob") -> largest |actual - expected| / tolerance seen.
    worst: dict[str, float] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def fail(self, where: str, actual: object, expected: object, rule: str = "exact") -> None:
        self.mismatches.append(Mismatch(where, _show(actual), _show(expected), rule))

    def observe(self, quantity: str, difference: float, tolerance: float) -> None:
        ratio = difference / tolerance if tolerance > 0 else math.inf
        if ratio > self.worst.get(quantity, -1.0):
            self.worst[quantity] = ratio

    def merge(self, other: Comparison) -> None:
        self.mismatches.extend(other.mismatches)
        for quantity, ratio in other.worst.items():
            if ratio > self.worst.get(quantity, -1.0):
                self.worst[quantity] = ratio

    def report(self, limit: int = 20) -> str:
        if self.ok:
            return "same"
        lines = [f"{len(self.mismatches)} difference(s):"]
        lines += [f"  {m}" for m in self.mismatches[:limit]]
        if len(self.mismatches) > limit:
            lines.append(f"  ... and {len(self.mismatches) - limit} more")
        return "\n".join(lines)


def _show(value: object) -> str:
    if isinstance(value, str):
        return repr(value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _numbers_equal(actual: float, expected: float) -> bool:
    if math.isnan(expected):
        return math.isnan(actual)
    return actual == expected


def _compare_number(
    out: Comparison, where: str, quantity: str, actual: float, expected: float, tolerance: float
) -> None:
    if not math.isfinite(expected) or not math.isfinite(actual):
        if not _numbers_equal(actual, expected):
            out.fail(where, actual, expected, "non-finite values are exact")
        return
    difference = abs(actual - expected)
    out.observe(quantity, difference, tolerance)
    if difference > tolerance:
        out.fail(where, actual, expected, f"|difference| {difference:.3g} > {tolerance:.3g}")


def _presentation(table: list[tuple[Id, float]]) -> list[tuple[Id, float]]:
    """Descending logprob (NaN last), ties by ascending identity."""

    def key(entry: tuple[Id, float]) -> tuple[bool, float, str, Id]:
        ident, value = entry
        return (math.isnan(value), -value if not math.isnan(value) else 0.0,
                type(ident).__name__, ident)

    return sorted(table, key=key)


def _compare_table(
    out: Comparison,
    where: str,
    quantity: str,
    actual: list[tuple[Id, float]],
    expected: list[tuple[Id, float]],
    tolerance: float,
    order: str,
) -> None:
    if order == "slot":
        actual, expected = _presentation(actual), _presentation(expected)
    elif order == "descending":
        values = [v for _, v in actual]
        for i in range(len(values) - 1):
            if values[i] < values[i + 1]:
                out.fail(f"{where}[{i + 1}]", values[i + 1], f"<= {values[i]!r}",
                         "a descending table must not increase")
                return
    else:
        raise ValueError(f"unknown table order {order!r}")
    for (_, a), (_, e) in zip(actual, expected, strict=False):
        if math.isfinite(a) and math.isfinite(e):
            out.observe(quantity, abs(a - e), tolerance)
    why = ranking_difference(actual, expected, tolerance)
    if why is not None:
        out.fail(where, actual, expected, f"top-k table, tie-aware: {why}")


# ------------------------------------------------------------------------- engine frames


def _decimals(spec: ProtocolSpec, type_name: str) -> int:
    """Printed decimals of a fixed-point type, from its regex (``\\.[0-9]{6}`` -> 6)."""
    regex = str(spec.types[type_name]["regex"])
    found = re.search(r"\\\.\[0-9\](?:\{(\d+)\})?", regex)
    if found is None:
        raise ValueError(f"type {type_name} is not fixed-point: {regex}")
    return int(found.group(1) or 1)


def _has_logprob(items: Sequence[Mapping[str, Any]]) -> bool:
    for item in items:
        if item.get("type") == LOGPROB_TYPE:
            return True
        nested = item.get("optional") or item.get("fields")
        if nested and _has_logprob(nested):
            return True
    return False


def kind_b_kinds(spec: ProtocolSpec | None = None) -> frozenset[str]:
    """Engine line kinds whose grammar holds a kind-(b) (logprob) field."""
    spec = spec or load_spec()
    return frozenset(k for k, line in spec.engine_lines.items() if _has_logprob(line.fields))


def table_groups(spec: ProtocolSpec | None = None) -> frozenset[tuple[str, str]]:
    """``(kind, group)`` of every repeated group of the grammar with a logprob field."""
    spec = spec or load_spec()
    found: set[tuple[str, str]] = set()

    def walk(kind: str, items: Sequence[Mapping[str, Any]]) -> None:
        for item in items:
            if "optional" in item:
                walk(kind, item["optional"])
            elif "fields" in item:
                if any(f.get("type") == LOGPROB_TYPE for f in item["fields"]):
                    found.add((kind, str(item["name"])))
                walk(kind, item["fields"])

    for kind, line in spec.engine_lines.items():
        walk(kind, line.fields)
    return frozenset(found)


@dataclass(frozen=True)
class FrameComparer:
    """Compares engine frames by the grammar of spec/protocol.json."""

    tolerance: Tolerance
    spec: ProtocolSpec = field(default_factory=load_spec)

    def logprob_tolerance(self) -> float:
        return printed(self.tolerance.logprob, _decimals(self.spec, LOGPROB_TYPE))

    def lines(self, actual: Sequence[str], expected: Sequence[str]) -> Comparison:
        """Two transcripts of ``header[ | payload]`` lines (timings already masked)."""
        out = Comparison()
        for index, (a, e) in enumerate(zip(actual, expected, strict=False)):
            out.merge(self.line(a, e, f"line {index}"))
        if len(actual) != len(expected):
            out.fail("transcript", f"{len(actual)} lines", f"{len(expected)} lines")
            extra = actual[len(expected) :] or expected[len(actual) :]
            out.fail(f"line {min(len(actual), len(expected))}", "(first unmatched)", extra[0])
        return out

    def line(self, actual: str, expected: str, where: str = "line") -> Comparison:
        """One transcript line: exact unless its kind's grammar holds a logprob."""
        out = Comparison()
        kind = expected.split(" ", 1)[0]
        entry = self.spec.engine_lines.get(kind)
        if entry is None or not _has_logprob(entry.fields):
            if actual != expected:
                out.fail(f"{where} ({kind})", actual, expected)
            return out
        a_head, a_payload = _split(actual, entry.payload is not None)
        e_head, e_payload = _split(expected, entry.payload is not None)
        if a_payload != e_payload:
            out.fail(f"{where} ({kind}) payload", a_payload, e_payload)
        e_parsed = parse_line(e_head, self.spec)
        if e_parsed is None:
            raise ValueError(f"{where}: expected line of unknown kind {expected!r}")
        try:
            a_parsed = parse_line(a_head, self.spec)
        except ProtocolViolation as bad:
            out.fail(f"{where} ({kind})", actual, expected, f"grammar: {bad}")
            return out
        if a_parsed is None or a_parsed.kind != kind:
            out.fail(f"{where} ({kind})", actual, expected, "kind")
            return out
        self._items(out, f"{where} ({kind})", kind, entry.fields,
                    dict(a_parsed.values), dict(e_parsed.values))
        return out

    def _items(
        self,
        out: Comparison,
        where: str,
        kind: str,
        items: Sequence[Mapping[str, Any]],
        actual: Mapping[str, Any],
        expected: Mapping[str, Any],
    ) -> None:
        for item in items:
            if "literal" in item:
                continue
            if "optional" in item:
                self._items(out, where, kind, item["optional"], actual, expected)
                continue
            name = str(item["name"])
            if (name in actual) != (name in expected):
                out.fail(f"{where} {name}", actual.get(name, "(absent)"),
                         expected.get(name, "(absent)"))
                continue
            if name not in expected:
                continue
            a, e = actual[name], expected[name]
            if "type" in item:
                if item["type"] == LOGPROB_TYPE:
                    _compare_number(out, f"{where} {name}", f"{kind}.{name}", float(a),
                                    float(e), self.logprob_tolerance())
                elif type(a) is not type(e) or not _numbers_equal_or_same(a, e):
                    out.fail(f"{where} {name}", a, e)
            else:
                self._group(out, f"{where} {name}", kind, item, a, e)

    def _group(
        self,
        out: Comparison,
        where: str,
        kind: str,
        item: Mapping[str, Any],
        actual: list[dict[str, Any]],
        expected: list[dict[str, Any]],
    ) -> None:
        fields = item["fields"]
        score = [f["name"] for f in fields if f.get("type") == LOGPROB_TYPE]
        if not score:
            if len(actual) != len(expected):
                out.fail(where, f"{len(actual)} entries", f"{len(expected)} entries")
                return
            for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
                self._items(out, f"{where}[{i}]", kind, fields, a, e)
            return
        order = TABLE_ORDER.get((kind, str(item["name"])))
        if order is None:
            raise ValueError(f"{kind}.{item['name']}: a top-k table with no stated order")
        (lp,) = score
        others = [str(f["name"]) for f in fields if f["name"] != lp]

        def table(entries: list[dict[str, Any]]) -> list[tuple[Id, float]]:
            return [(_identity(e, others), float(e[lp])) for e in entries]

        _compare_table(out, where, f"{kind}.{item['name']}.{lp}", table(actual),
                       table(expected), self.logprob_tolerance(), order)


def _numbers_equal_or_same(a: object, e: object) -> bool:
    if isinstance(a, float) and isinstance(e, float):
        return _numbers_equal(a, e)
    return a == e


def _identity(entry: Mapping[str, Any], names: Sequence[str]) -> Id:
    values = [entry[n] for n in names]
    if len(values) == 1 and isinstance(values[0], int | str):
        return values[0]
    return json.dumps(values, sort_keys=True, ensure_ascii=False)


def _split(line: str, has_payload: bool) -> tuple[str, str | None]:
    if not has_payload:
        return line, None
    head, sep, payload = line.partition(PAYLOAD_SEPARATOR)
    return head, payload if sep else None


# --------------------------------------------------------------------------- HTTP / JSON


@cache
def _schemas() -> dict[str, dict[str, Any]]:
    docs: dict[str, dict[str, Any]] = {}
    for path in sorted(resources.spec_path("schemas").glob("*.json")):
        docs[path.name] = json.loads(path.read_text(encoding="utf-8"))
    return docs


@cache
def _registry() -> referencing.Registry[Any]:
    pairs = [(doc["$id"], DRAFT202012.create_resource(doc)) for doc in _schemas().values()]
    return referencing.Registry().with_resources(pairs)


def _valid(schema: Mapping[str, Any], base: str, instance: Any) -> bool:
    wrapped = {"$schema": "https://json-schema.org/draft/2020-12/schema",
               "$id": _SCHEMA_BASE + base + "#branch", **schema}
    validator = jsonschema.Draft202012Validator(wrapped, registry=_registry())
    return bool(validator.is_valid(instance))


@dataclass(frozen=True)
class JsonComparer:
    """Compares HTTP JSON bodies and SSE event data by their schema in spec/schemas."""

    tolerance: Tolerance
    #: Printed decimals of the logprobs the server relays (the wire's ``%.6f``).
    decimals: int = field(default_factory=lambda: _decimals(load_spec(), LOGPROB_TYPE))

    def logprob_tolerance(self) -> float:
        return printed(self.tolerance.logprob, self.decimals)

    def body(self, actual: Any, expected: Any, schema: str | None, where: str = "body"
             ) -> Comparison:
        """One JSON document; ``schema`` is a file stem of spec/schemas (None: exact)."""
        out = Comparison()
        if schema is None:
            _exact(out, where, actual, expected)
            return out
        name = f"{schema}.json"
        self._walk(out, where, _schemas()[name], name, actual, expected)
        return out

    def transcript(
        self, actual: Mapping[str, Any], expected: Mapping[str, Any], schema: str | None
    ) -> Comparison:
        """A recorded exchange: ``status``, ``headers`` and ``text`` exact, ``body`` or
        each of ``events`` (SSE; ``{"event", "data"}`` or the bare data) by ``schema``."""
        out = Comparison()
        if sorted(actual) != sorted(expected):
            out.fail("transcript keys", sorted(actual), sorted(expected))
        for key in sorted(set(actual) & set(expected)):
            a, e = actual[key], expected[key]
            if key == "body":
                out.merge(self.body(a, e, schema))
            elif key == "events" and isinstance(a, list) and isinstance(e, list):
                if len(a) != len(e):
                    out.fail("events", f"{len(a)} events", f"{len(e)} events")
                for i, (ae, ee) in enumerate(zip(a, e, strict=False)):
                    out.merge(self._event(ae, ee, schema, f"events[{i}]"))
            else:
                _exact(out, key, a, e)
        return out

    def _event(self, actual: Any, expected: Any, schema: str | None, where: str
               ) -> Comparison:
        if isinstance(expected, dict) and set(expected) == {"event", "data"}:
            out = Comparison()
            if not isinstance(actual, dict) or set(actual) != {"event", "data"}:
                out.fail(where, actual, expected)
                return out
            _exact(out, f"{where}.event", actual["event"], expected["event"])
            out.merge(self.body(actual["data"], expected["data"], schema, f"{where}.data"))
            return out
        if isinstance(expected, str):  # "[DONE]"
            out = Comparison()
            _exact(out, where, actual, expected)
            return out
        return self.body(actual, expected, schema, where)

    def _resolve(self, schema: Mapping[str, Any], base: str) -> tuple[Mapping[str, Any], str]:
        while "$ref" in schema:
            ref = str(schema["$ref"])
            target, _, pointer = ref.partition("#")
            base = target.rsplit("/", 1)[-1] if target else base
            node: Any = _schemas()[base]
            for part in (p for p in pointer.split("/") if p):
                node = node[part]
            schema = node
        return schema, base

    def _walk(
        self,
        out: Comparison,
        where: str,
        schema: Mapping[str, Any],
        base: str,
        actual: Any,
        expected: Any,
    ) -> None:
        schema, base = self._resolve(schema, base)
        sameness = schema.get(SAMENESS_KEY)
        if sameness == "logprob":
            self._logprob(out, where, actual, expected)
            return
        if sameness == "ranking":
            self._ranking(out, where, schema, base, actual, expected)
            return
        if sameness is not None:
            raise ValueError(f"{where}: unknown {SAMENESS_KEY} {sameness!r}")
        for combinator in ("oneOf", "anyOf"):
            if combinator in schema:
                branches = [b for b in schema[combinator] if _valid(b, base, expected)]
                if len(branches) != 1:
                    # The stored copy fits no single branch: nothing to be lenient about.
                    _exact(out, where, actual, expected)
                    return
                if not _valid(branches[0], base, actual):
                    out.fail(where, actual, expected, f"not the same {combinator} branch")
                    return
                self._walk(out, where, branches[0], base, actual, expected)
                return
        if isinstance(expected, dict) and isinstance(actual, dict):
            if sorted(actual) != sorted(expected):
                out.fail(f"{where} keys", sorted(actual), sorted(expected))
            properties = schema.get("properties", {})
            extra = schema.get("additionalProperties")
            for key in sorted(set(actual) & set(expected)):
                child = properties.get(key, extra if isinstance(extra, dict) else {})
                self._walk(out, f"{where}.{key}", child, base, actual[key], expected[key])
            return
        if isinstance(expected, list) and isinstance(actual, list):
            items = schema.get("items")
            if not isinstance(items, dict):
                _exact(out, where, actual, expected)
                return
            if len(actual) != len(expected):
                out.fail(where, f"{len(actual)} items", f"{len(expected)} items")
            for i, (a, e) in enumerate(zip(actual, expected, strict=False)):
                self._walk(out, f"{where}[{i}]", items, base, a, e)
            return
        _exact(out, where, actual, expected)

    def _logprob(self, out: Comparison, where: str, actual: Any, expected: Any) -> None:
        if _is_number(actual) and _is_number(expected):
            _compare_number(out, where, _quantity(where), float(actual), float(expected),
                            self.logprob_tolerance())
        else:
            _exact(out, where, actual, expected)

    def _ranking(
        self,
        out: Comparison,
        where: str,
        schema: Mapping[str, Any],
        base: str,
        actual: Any,
        expected: Any,
    ) -> None:
        if isinstance(expected, dict) and isinstance(actual, dict):
            # A map identity -> logprob (completions top_logprobs): no order to compare.
            def pairs(m: Mapping[str, Any]) -> list[tuple[Id, float]]:
                return [(k, _score(v)) for k, v in m.items()]

            _compare_table(out, where, _quantity(where), pairs(actual), pairs(expected),
                           self.logprob_tolerance(), "slot")
            return
        if isinstance(expected, list) and isinstance(actual, list):
            items, _ = self._resolve(schema.get("items", {}), base)
            properties = items.get("properties", {})
            score = [k for k, v in properties.items() if v.get(SAMENESS_KEY) == "logprob"]
            if len(score) != 1:
                raise ValueError(f"{where}: a ranking needs one logprob member, has {score}")
            (lp,) = score
            if not all(isinstance(x, dict) and lp in x for x in actual + expected):
                _exact(out, where, actual, expected)
                return

            def entries(xs: list[dict[str, Any]]) -> list[tuple[Id, float]]:
                return [(json.dumps({k: v for k, v in x.items() if k != lp}, sort_keys=True,
                                    ensure_ascii=False), _score(x[lp])) for x in xs]

            # The server relays the engine's slot order (spec/protocol.md 2.5).
            _compare_table(out, where, _quantity(where), entries(actual), entries(expected),
                           self.logprob_tolerance(), "slot")
            return
        _exact(out, where, actual, expected)


def _score(value: Any) -> float:
    return float(value) if _is_number(value) else math.nan


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _quantity(where: str) -> str:
    """``body.choices[0].logprobs.content[3].logprob`` -> ``http:...content[].logprob``."""
    return "http:" + re.sub(r"\[\d+\]", "[]", where.split(".", 1)[-1])


def _exact(out: Comparison, where: str, actual: Any, expected: Any) -> None:
    if not _same_json(actual, expected):
        out.fail(where, actual, expected)


def _same_json(a: Any, e: Any) -> bool:
    """Equal as JSON values: 1 and 1.0 and True are three different values."""
    if type(a) is not type(e):
        return False
    if isinstance(e, dict):
        return a.keys() == e.keys() and all(_same_json(a[k], e[k]) for k in e)
    if isinstance(e, list):
        return len(a) == len(e) and all(_same_json(x, y) for x, y in zip(a, e, strict=True))
    if isinstance(e, float):
        return _numbers_equal(a, e)
    return bool(a == e)
