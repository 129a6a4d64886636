"""What a report was produced with: the suite's version and the spec revisions it checks.

A CI that keeps reports across runs needs to tell a changed target from a changed suite:
``suite_version`` is the colibri version plus a digest of the case files (so an edited case
changes it even within one release), ``spec`` the revisions of the documents cases cite.
"""

from __future__ import annotations

import functools
import hashlib
import re

from colibri.conformance.cases import cases_dir

from colibri import __version__
from colibri.protocol import load_spec
from colibri.resources import spec_path


@functools.cache
def cases_digest(suite: str) -> str:
    digest = hashlib.sha256()
    for path in sorted((cases_dir() / suite).glob("*.json")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


@functools.cache
def spec_versions() -> dict[str, str]:
    openapi = spec_path("openapi.yaml").read_text(encoding="utf-8")
    found = re.search(r'"version":\s*"([^"]+)"', openapi)
    return {
        "protocol.md": f"revision {load_spec().revision}",
        "openapi.yaml": found.group(1) if found else "unknown",
        "seed": "serve_protocol.md",
    }


def report_header(suite: str) -> dict[str, object]:
    return {
        "suite": suite,
        "suite_version": f"{__version__}+cases.{cases_digest(suite)}",
        "spec": spec_versions(),
    }
