"""``colibri.benchmarks.page_mapping``: a checkpoint's resident and 2 MiB-mapped bytes from
``/proc/self/smaps``, summed over its files' mappings and nothing else."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from colibri.benchmarks.page_mapping import checkpoint_mapping, mapped_sizes


def mapping(start: str, path: str, rss_kib: int, pmd_kib: int) -> str:
    return (f"{start}-{start}f000 r--s 00000000 fe:00 4242                     {path}\n"
            f"Size:               8192 kB\nRss:             {rss_kib:6d} kB\n"
            f"Pss:             {rss_kib:6d} kB\nAnonHugePages:         0 kB\n"
            f"FilePmdMapped:   {pmd_kib:6d} kB\nTHPeligible:           0\n"
            f"VmFlags: rd mr me ms\n")


def test_only_the_files_mappings_are_summed(tmp_path: Path) -> None:
    a, b, other = tmp_path / "a.safetensors", tmp_path / "b.safetensors", tmp_path / "c.bin"
    text = (mapping("7f0000000000", str(a), 4096, 2048) + mapping("7f0000100000", str(b), 1024, 0)
            + mapping("7f0000200000", str(a), 512, 0)  # a second mapping of the same file
            + mapping("7f0000300000", str(other), 9999, 9999)
            + "7f0000400000-7f0000401000 rw-p 00000000 00:00 0 \nRss:  4 kB\n")
    assert mapped_sizes(text, [str(a), str(b)]) == {"resident_bytes": (4096 + 1024 + 512) * 1024,
                                                    "huge_mapped_bytes": 2048 * 1024}


def test_this_process_sees_its_own_map_of_a_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\0" * (4 << 20))
    weights = np.memmap(path, dtype=np.uint8, mode="r")
    assert int(weights[::4096].sum()) == 0  # fault every page in
    got = checkpoint_mapping(tmp_path)
    assert got is not None
    assert got["resident_bytes"] >= 4 << 20
    assert 0 <= got["huge_mapped_bytes"] <= got["resident_bytes"]
    assert got["huge_mapped_fraction"] == got["huge_mapped_bytes"] / got["resident_bytes"]
    del weights


def test_no_smaps_is_none(tmp_path: Path) -> None:
    assert checkpoint_mapping(tmp_path, smaps=tmp_path / "absent") is None
