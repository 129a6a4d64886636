"""Target descriptions: how to drive an engine, as data instead of a wrapper script.

A JSON file (schema: spec/conformance-target.schema.json, documented in
spec/conformance.md "Target descriptions")::

    {"name": "colibri glm.c (b50015e)",
     "command": "/tmp/colibri-c/glm 64 16 16",
     "env": {"OMP_NUM_THREADS": "2"},
     "state_dir": "snap",
     "tokenizer": "byte-level",
     "capabilities": [],
     "expectations": "glm-c.expectations.json"}

``state_dir`` says where the engine keeps ``.coli_kv``/``.coli_usage``: ``env`` (it honours
COLI_STATE_DIR) or ``snap`` (next to the model; each session then gets a private model
directory of links). ``tokenizer``: ``model`` (use the model's own, or ids=1 payloads when it
has none and the engine announces ids), ``byte-level`` (the suite writes a one-id-per-byte
tokenizer.json, conformance/byte_tokenizer.py, into a model directory of links: for engines
that always load ``<SNAP>/tokenizer.json``). ``capabilities`` are extensions the engine has
but cannot announce (no CAPS line) and the suite cannot probe safely, and for an engine of
colibri's serve_codec dialect (spec/protocol.md §5) ``codec_wire`` and the switches of its wire
profile. Relative paths are relative to the file.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
from colibri.conformance.capabilities import DECLARABLE, unknown

from colibri.resources import spec_path

SCHEMA_FILE = "conformance-target.schema.json"


class TargetFileError(ValueError):
    pass


@dataclass(frozen=True)
class TargetDescription:
    name: str
    command: str
    env: dict[str, str] = field(default_factory=dict)
    state_dir: str = "env"
    tokenizer: str = "model"
    capabilities: frozenset[str] = frozenset()
    expectations: Path | None = None
    startup_timeout: float = 120.0

    @classmethod
    def load(cls, path: Path) -> TargetDescription:
        try:
            document: Any = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise TargetFileError(f"{path}: {exc}") from exc
        return cls.from_document(document, path.parent, str(path))

    @classmethod
    def from_document(cls, document: Any, base: Path, source: str) -> TargetDescription:
        schema = json.loads(spec_path(SCHEMA_FILE).read_text(encoding="utf-8"))
        errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(document),
                        key=lambda e: list(e.absolute_path))
        if errors:
            where = "/".join(str(p) for p in errors[0].absolute_path) or "(top)"
            raise TargetFileError(f"{source}: {where}: {errors[0].message}")
        declared = frozenset(document.get("capabilities", []))
        strange = unknown(declared) + sorted(declared - DECLARABLE - set(unknown(declared)))
        if strange:
            raise TargetFileError(
                f"{source}: capabilities {strange} are not protocol extensions or dialect "
                "switches"
            )
        expectations = document.get("expectations")
        argv = shlex.split(document["command"])
        # A command naming a file next to the description runs from there.
        if argv and not Path(argv[0]).is_absolute() and (base / argv[0]).exists():
            argv[0] = str((base / argv[0]).resolve())
        return cls(
            name=document.get("name", document["command"]),
            command=shlex.join(argv),
            env={str(k): str(v) for k, v in document.get("env", {}).items()},
            state_dir=document.get("state_dir", "env"),
            tokenizer=document.get("tokenizer", "model"),
            capabilities=declared,
            expectations=(base / expectations).resolve() if expectations else None,
            startup_timeout=float(document.get("startup_timeout", 120.0)),
        )
