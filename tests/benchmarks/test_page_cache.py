"""``colibri.benchmarks.page_cache``: the files a section times are read back from disk once per
run, named in the report, left alone when they would not fit, and never changed."""

from __future__ import annotations

import hashlib
import json
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from colibri.benchmarks import BenchOptions, page_cache
from colibri.benchmarks.page_cache import (
    available_memory_bytes,
    model_files,
    refresh_for,
    refresh_page_cache,
)
from colibri.benchmarks.page_mapping import cached_mapping
from colibri.cli import main
from colibri.resources import fixture_model_dir

LINUX = sys.platform.startswith("linux")


def weight_file(path: Path, size: int, seed: int) -> Path:
    path.write_bytes(np.random.default_rng(seed).integers(0, 256, size, np.uint8).tobytes())
    return path


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_a_refresh_reads_every_file_back_and_changes_none(tmp_path: Path) -> None:
    files = [weight_file(tmp_path / f"m{i}.safetensors", (3 << 20) + 4096 * i + 7, i)
             for i in range(2)]
    before = [digest(f) for f in files]
    report = refresh_page_cache(files, done=set())
    assert report["files"] == [str(f.resolve()) for f in files]
    assert report["bytes"] == sum(f.stat().st_size for f in files)
    assert report["seconds"] >= 0
    if LINUX:  # read from /proc/self/smaps while the files were mapped
        assert 0.0 <= report["huge_mapped_fraction"] <= 1.0
    assert [digest(f) for f in files] == before


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_each_file_is_refreshed_once_per_run(tmp_path: Path) -> None:
    a, b = (weight_file(tmp_path / f"{n}.safetensors", 1 << 20, 1) for n in "ab")
    done: set[Path] = set()
    assert refresh_page_cache([a], done=done)["files"] == [str(a.resolve())]
    assert refresh_page_cache([a, b], done=done)["files"] == [str(b.resolve())]
    assert "earlier in this run" in refresh_page_cache([b, a], done=done)["skipped"]
    assert done == {a.resolve(), b.resolve()}


def test_files_that_would_not_fit_are_left_as_they_are(tmp_path: Path) -> None:
    a = weight_file(tmp_path / "a.safetensors", 1 << 20, 2)
    done: set[Path] = set()
    report = refresh_page_cache([a], available_bytes=(2 << 20) - 1, done=done)
    assert "more than half the available memory" in report["skipped"]
    assert done == set()  # so a later run with the memory for them still refreshes them


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    report = refresh_page_cache([tmp_path / "gone.gguf"], done=set())
    assert str(tmp_path / "gone.gguf") in report["skipped"]


def test_a_file_that_cannot_be_read_back_is_named_and_marks_nothing_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = (weight_file(tmp_path / f"{n}.safetensors", 1 << 20, 4) for n in "ab")
    real = page_cache._read_back
    opened: list[object] = []

    def failing_on_b(path: Path) -> object:
        if path.name == "b.safetensors":
            raise OSError(5, "Input/output error")
        view = real(path)
        opened.append(view)
        return view

    monkeypatch.setattr(page_cache, "_read_back", failing_on_b)
    done: set[Path] = set()
    report = refresh_page_cache([a, b], done=done)
    assert report == {"skipped": f"cannot read {b.resolve()} back: [Errno 5] Input/output error"}
    assert done == set()
    assert all(getattr(v, "closed", True) for v in opened)  # the maps made before it are closed


def test_available_memory_comes_from_meminfo(tmp_path: Path) -> None:
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   12345 kB\n")
    assert available_memory_bytes(meminfo) == 12345 * 1024
    meminfo.write_text("MemTotal:       24000000 kB\n")
    assert available_memory_bytes(meminfo) is None
    assert available_memory_bytes(tmp_path / "nope") is None


def test_keep_page_cache_leaves_the_files_and_missing_peers_are_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(page_cache, "REFRESHED", set())
    a = weight_file(tmp_path / "a.safetensors", 1 << 20, 3)
    assert refresh_for(BenchOptions(refresh_page_cache=False), [a]) == {
        "skipped": "--keep-page-cache"}
    assert page_cache.REFRESHED == set()
    if hasattr(os, "posix_fadvise"):  # a GGUF that was never built is not an error
        got = refresh_for(BenchOptions(), [a, tmp_path / "model-f32.gguf"])
        assert got["files"] == [str(a.resolve())]
    assert model_files(tmp_path) == [a]


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_the_roofline_section_reports_the_refresh_and_the_flag_turns_it_off(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Through the CLI on the tiny fixture: the section names its checkpoint's files."""
    monkeypatch.setattr(page_cache, "REFRESHED", set())
    model = fixture_model_dir("glm5-tiny")
    argv = ["bench", "--section", "accelerated-roofline", "--model", str(model),
            "--tokens", "2", "--batch", "2", "--no-peers"]
    assert main(argv) == 0
    got = json.loads(capsys.readouterr().out)["sections"]["accelerated-roofline"]["page_cache"]
    assert got["files"] == [str(f.resolve()) for f in model_files(model)]
    monkeypatch.setattr(page_cache, "REFRESHED", set())
    assert main([*argv, "--keep-page-cache"]) == 0
    got = json.loads(capsys.readouterr().out)["sections"]["accelerated-roofline"]["page_cache"]
    assert got == {"skipped": "--keep-page-cache"}


@pytest.mark.skipif(not LINUX, reason="mincore and /proc/self/smaps are Linux's")
def test_a_refreshed_file_is_all_cached_and_the_module_runs_as_a_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(page_cache, "REFRESHED", set())
    a = weight_file(tmp_path / "a.safetensors", (2 << 20) + 123, 5)
    assert page_cache.main([str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["files"] == [str(a.resolve())]
    state = cached_mapping([a])
    assert state is not None
    assert state["file_bytes"] == a.stat().st_size
    assert state["cached_bytes"] == a.stat().st_size  # mincore: every page back in the cache
    assert 0.0 <= state["huge_mapped_fraction"] <= 1.0
    assert page_cache.main([str(tmp_path)]) == 1  # once per run: the second is skipped
    assert "earlier in this run" in json.loads(capsys.readouterr().out)["skipped"]


@pytest.mark.parametrize(("cached", "fraction", "status"), [
    (1 << 30, 0.01, "warn"),   # a large checkpoint cached in 4 KiB pages
    (1 << 30, 0.99, "ok"),
    (1 << 20, 0.0, "ok"),      # too little cached to matter
])
def test_doctor_warns_of_a_large_checkpoint_cached_in_small_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cached: int, fraction: float, status: str
) -> None:
    from colibri import doctor
    from colibri.benchmarks import page_mapping

    monkeypatch.setattr(page_mapping, "cached_mapping", lambda files: {
        "file_bytes": 2 << 30, "cached_bytes": cached, "huge_mapped_fraction": fraction})
    check = doctor.check_model_page_cache([tmp_path / "model.safetensors"])
    assert check.status == status
    assert f"{cached / 1e9:.2f} of {(2 << 30) / 1e9:.2f} GB" in check.summary
    if status == "warn":
        assert f"python -m colibri.benchmarks.page_cache {tmp_path}" in check.summary


@pytest.mark.skipif(not LINUX, reason="mincore and /proc/self/smaps are Linux's")
def test_doctor_model_reports_the_page_cache(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--json", "--model", str(fixture_model_dir("glm5-tiny"))]) in (0, 1)
    checks = {c["id"]: c for c in json.loads(capsys.readouterr().out)["checks"]}
    assert checks["model_page_cache"]["status"] == "ok"  # a few MB: never worth a warning
    assert "GB of weights in the page cache" in checks["model_page_cache"]["summary"]


@pytest.mark.skipif(not LINUX, reason="mincore and /proc/self/smaps are Linux's")
def test_the_cached_state_maps_at_most_its_page_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from colibri.benchmarks import page_mapping

    a = weight_file(tmp_path / "a.safetensors", 8 << 20, 6)
    int(np.fromfile(a, dtype=np.uint8)[::4096].sum())  # cached by the write and this read
    monkeypatch.setattr(page_mapping, "TOUCH_PAGES", 16)
    state = cached_mapping([a])
    assert state is not None and state["cached_bytes"] == 8 << 20
    # 16 pages touched: 4 KiB each, or one 2 MiB entry each where the kernel maps so
    assert 0 < state["resident_bytes"] <= 16 * (2 << 20)
