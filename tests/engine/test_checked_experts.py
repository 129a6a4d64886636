"""``CheckedExperts``: an expert found finite is not scanned again while its files are
unchanged, and is scanned again once a file is replaced or rewritten."""

from __future__ import annotations

import os
from pathlib import Path

from colibri.backend_kit.checked_experts import CheckedExperts


def test_a_verdict_holds_for_the_files_it_was_made_on(tmp_path: Path) -> None:
    shard, other = tmp_path / "experts.safetensors", tmp_path / "other.safetensors"
    shard.write_bytes(b"x" * 64)
    other.write_bytes(b"y" * 64)
    checked = CheckedExperts(lambda layer, e: [shard] if e < 4 else [shard, other])
    assert not checked.known_finite(1, 2)
    checked.record_finite(1, 2)
    checked.record_finite(1, 5)
    assert checked.known_finite(1, 2) and checked.known_finite(1, 5)
    assert not checked.known_finite(1, 3) and not checked.known_finite(2, 2)
    stat = other.stat()
    other.write_bytes(b"z" * 64)  # rewritten in place: a new modification time
    os.utime(other, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    assert checked.known_finite(1, 2) and not checked.known_finite(1, 5)
    replacement = tmp_path / "new.safetensors"
    replacement.write_bytes(b"x" * 64)
    replacement.replace(shard)  # replaced: another inode
    assert not checked.known_finite(1, 2)
    shard.unlink()
    checked.record_finite(1, 2)  # a file gone: nothing is recorded
    assert not checked.known_finite(1, 2)
