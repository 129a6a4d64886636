"""The C library's incremental build: a variant is compiled only when its stamp (sources,
flags, compiler) changed, and the build says which it compiled."""

from __future__ import annotations

from pathlib import Path

import pytest
from colibri.accelerated import native_build
from colibri.accelerated.native_build import Variant, build_variant


def test_a_variant_is_compiled_once_then_reported_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled: list[Path] = []

    def fake_compile(target: Path, stamp: str, command: object) -> None:
        # Stands in for the compiler: writes the library and its stamp as compile_library does.
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(b"library")
        target.with_suffix(".stamp").write_text(stamp)
        compiled.append(target)

    monkeypatch.setattr(native_build, "compile_library", fake_compile)
    variant = Variant("generic", ())
    path, fresh = build_variant("cc", variant, tmp_path)
    assert fresh and compiled == [path]
    assert build_variant("cc", variant, tmp_path) == (path, False) and len(compiled) == 1
    # Another compiler (or other flags) changes the stamp: compiled again.
    assert build_variant("clang", variant, tmp_path) == (path, True) and len(compiled) == 2


def test_main_prints_one_current_line_when_nothing_was_compiled(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(native_build, "compiler", lambda: "cc")
    monkeypatch.setattr(native_build, "build", lambda: [(Path("/o/generic/lib.so"), False),
                                                         (Path("/o/avx2/lib.so"), False)])
    assert native_build.main([]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"C library in {native_build.DEFAULT_OUT} is current (2 file(s))"]
    monkeypatch.setattr(native_build, "build", lambda: [(Path("/o/generic/lib.so"), False),
                                                         (Path("/o/avx2/lib.so"), True)])
    assert native_build.main([]) == 0
    assert capsys.readouterr().out.splitlines() == ["built /o/avx2/lib.so"]
