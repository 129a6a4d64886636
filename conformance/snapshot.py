"""Model directories the harness arranges for a target: links to the model's files plus
what the target needs (a generated tokenizer.json, a private place for its state files).

An engine that keeps ``.coli_kv``/``.coli_usage`` next to the model (``$SNAP``) gets one such
directory per session, so state never leaks between cases and the committed fixtures are
never written to.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any


def link_model(model_dir: Path, dest: Path) -> None:
    """Symlink every file of model_dir into dest (existing names are left alone)."""
    dest.mkdir(parents=True, exist_ok=True)
    for item in model_dir.iterdir():
        link = dest / item.name
        if not link.exists() and not link.is_symlink():
            link.symlink_to(item.resolve())


def with_tokenizer(model_dir: Path, tokenizer: dict[str, Any]) -> Path:
    """A temporary model directory: model_dir's files and the given tokenizer.json.

    It lives until the process exits (runners and their clones share it)."""
    dest = Path(tempfile.mkdtemp(prefix="colibri-snapshot-"))
    atexit.register(shutil.rmtree, dest, True)
    (dest / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    link_model(model_dir, dest)
    return dest
