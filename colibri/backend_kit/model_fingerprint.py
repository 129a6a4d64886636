"""The model tag of ``.coli_kv`` files: a cheap, stable name for a model's weights.

A KV file saved under one model must not be restored under another; both backends tag their
files with this fingerprint of the model directory.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

_SAMPLE = 1 << 16
_SAMPLES = 16


def model_fingerprint(model_dir: Path) -> int:
    """A non-zero int32 naming this model's weights (the `.coli_kv` model tag).

    sha256 over config.json and, per weight file, its size and 16 evenly spaced 64 KiB
    samples (the whole file when small): cheap on a large model, exact on the fixtures.
    """
    digest = hashlib.sha256()
    config = model_dir / "config.json"
    if config.is_file():
        digest.update(config.read_bytes())
    for path in sorted(model_dir.glob("*.safetensors")):
        size = path.stat().st_size
        digest.update(path.name.encode() + size.to_bytes(8, "little"))
        with open(path, "rb") as handle:
            if size <= _SAMPLE * _SAMPLES:
                digest.update(handle.read())
            else:
                for i in range(_SAMPLES):
                    handle.seek((size - _SAMPLE) * i // (_SAMPLES - 1))
                    digest.update(handle.read(_SAMPLE))
    tag = int.from_bytes(digest.digest()[:4], "little", signed=True)
    return tag or 1
