"""Conformance cases as data: loading and validating ``spec/cases/<suite>/*.json``.

Cases are data so that another implementation can read exactly what is checked, and so
the metadata (clause, capabilities, level) can select and report them without running
code. Each file holds one case object or a list of them; every case is validated against
``spec/conformance-case.schema.json`` before anything runs.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from colibri.conformance.capabilities import CORE, profile_of, unknown

from colibri.resources import spec_dir, spec_path

SCHEMA_FILE = "conformance-case.schema.json"

#: Expectation types the runner implements, per suite.
PROTOCOL_EXPECTATIONS = frozenset(
    {
        "grammar",
        "frame",
        "sequence",
        "relation",
        "same_stream",
        "exit",
        "golden",
        "legacy",
        "interleave",
        "logprobs",
        "state_files",
        "file",
        "invariant",
        "golden_bytes",
    }
)
HTTP_EXPECTATIONS = frozenset(
    {"status", "header", "json", "schema", "sse", "metrics", "relation", "one_of"}
)


class CaseError(ValueError):
    """A case file is malformed; the message names the file and the case."""


#: Steps that end or replace the engine process: a session using them needs its own engine.
LIFECYCLE_OPS = frozenset({"close_stdin", "await_exit", "restart", "kill", "fuzz"})
#: Steps that damage or mend the session's private model copy (``experts_apart``): no later
#: case may be served by an engine whose files were damaged, so they too need their own.
MODEL_OPS = frozenset({"truncate_experts", "restore_experts"})


@dataclass(frozen=True)
class Session:
    name: str
    engine: dict[str, Any]
    steps: list[dict[str, Any]]
    #: Needs a newly started engine (cold slots, its own state dir, lifecycle steps); other
    #: sessions may run on a pooled engine that earlier cases used.
    fresh: bool = False


@dataclass(frozen=True)
class Case:
    id: str
    suite: str
    area: str
    description: str
    clause: str
    level: str
    requires: frozenset[str]
    expect: list[dict[str, Any]]
    sessions: list[Session]
    fresh: bool = False
    server_args: tuple[str, ...] = ()
    source: str = ""
    #: Protocol cases: `core`, `colibri` or `serve_codec`, from what they require
    #: (conformance/capabilities.py); HTTP cases: whose documented contract they check
    #: (conformance/http_profiles.py).
    profile: str = ""
    #: The seed clause a core protocol case checks (spec/conformance.md).
    seed: str = ""
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def steps(self) -> list[dict[str, Any]]:
        return self.sessions[0].steps


@functools.cache
def _validator() -> jsonschema.protocols.Validator:
    # Checking the schema against its metaschema costs far more than validating every case
    # with it; once per process, not once per case file (16 of them).
    schema = json.loads(spec_path(SCHEMA_FILE).read_text(encoding="utf-8"))
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    validator: jsonschema.protocols.Validator = cls(schema)
    return validator


def _build(raw: dict[str, Any], source: str) -> Case:
    suite = raw["suite"]
    if not raw["id"].startswith(suite + "."):
        raise CaseError(f"{source}: case id {raw['id']!r} must start with '{suite}.'")
    allowed = PROTOCOL_EXPECTATIONS if suite == "protocol" else HTTP_EXPECTATIONS
    for expectation in raw["expect"]:
        if expectation["type"] not in allowed:
            raise CaseError(
                f"{source}: {raw['id']}: expectation {expectation['type']!r} "
                f"does not apply to the {suite} suite"
            )
    base_engine = dict(raw.get("engine", {}))
    if "sessions" in raw:
        if raw["steps"]:
            raise CaseError(f"{source}: {raw['id']}: give either steps or sessions, not both")
        specs = [
            (s["name"], {**base_engine, **s.get("engine", {})}, list(s["steps"]), s.get("fresh"))
            for s in raw["sessions"]
        ]
    else:
        specs = [("main", base_engine, list(raw["steps"]), None)]
    sessions = [
        Session(
            name,
            engine,
            steps,
            bool(fresh or raw.get("fresh")
                 or any(st["op"] in LIFECYCLE_OPS | MODEL_OPS for st in steps)),
        )
        for name, engine, steps, fresh in specs
    ]
    for session in sessions:
        damage = sorted({st["op"] for st in session.steps} & MODEL_OPS)
        if damage and not session.engine.get("experts_apart"):
            raise CaseError(
                f"{source}: {raw['id']}: session {session.name} uses {damage} without "
                "engine.experts_apart (a model copy of its own to damage)"
            )
    requires = frozenset(raw.get("requires", []))
    if suite == "protocol":
        strange = unknown(requires)
        if strange:
            raise CaseError(f"{source}: {raw['id']}: unknown capabilities {strange}")
        if profile_of(requires) == CORE and not raw.get("seed"):
            raise CaseError(
                f"{source}: {raw['id']}: a core case names the seed clause it checks ('seed')"
            )
    names = [s.name for s in sessions]
    if len(set(names)) != len(names):
        raise CaseError(f"{source}: {raw['id']}: session names repeat")
    return Case(
        id=raw["id"],
        suite=suite,
        area=raw["area"],
        description=raw["description"],
        clause=raw["clause"],
        level=raw["level"],
        requires=requires,
        expect=list(raw["expect"]),
        sessions=sessions,
        fresh=any(session.fresh for session in sessions),
        server_args=tuple(raw.get("server_args", [])),
        source=source,
        profile=raw.get("profile") or (profile_of(requires) if suite == "protocol" else ""),
        seed=str(raw.get("seed", "")),
        raw=raw,
    )


def parse_cases(document: Any, source: str) -> list[Case]:
    items = document if isinstance(document, list) else [document]
    validator = _validator()
    cases = []
    for number, item in enumerate(items):
        errors = sorted(validator.iter_errors(item), key=lambda e: list(e.absolute_path))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
            name = item.get("id", f"#{number}") if isinstance(item, dict) else f"#{number}"
            raise CaseError(f"{source}: case {name}: {where}: {errors[0].message}")
        cases.append(_build(item, source))
    return cases


#: (path, SHA-256 of the text) of every case file this process has validated already.
_VALIDATED: set[tuple[str, str]] = set()


def _parse_file(document: Any, path: Path, text: str) -> list[Case]:
    # Schema validation is most of loading (0.45 s for both suites); a process that loads
    # the same unchanged file again (a test session does, dozens of times) builds its cases
    # from a fresh parse of the text, without validating the same bytes twice.
    key = (str(path), hashlib.sha256(text.encode("utf-8")).hexdigest())
    if key not in _VALIDATED:
        cases = parse_cases(document, path.name)
        _VALIDATED.add(key)
        return cases
    items = document if isinstance(document, list) else [document]
    return [_build(item, path.name) for item in items]


def cases_dir() -> Path:
    return spec_dir() / "cases"


def load_cases(suite: str, extra: Iterable[Path] = ()) -> list[Case]:
    """Every case of a suite, sorted by id; ids must be unique."""
    files = sorted((cases_dir() / suite).glob("*.json")) + list(extra)
    cases: list[Case] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise CaseError(f"{path}: not JSON: {exc}") from exc
        cases.extend(c for c in _parse_file(document, path, text) if c.suite == suite)
    seen: dict[str, str] = {}
    for case in cases:
        if case.id in seen:
            raise CaseError(f"case id {case.id} defined in {seen[case.id]} and {case.source}")
        seen[case.id] = case.source
    return sorted(cases, key=lambda c: c.id)
