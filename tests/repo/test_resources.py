"""Where package data is found (colibri.resources): the real folders, and a clear error for
data that is not installed."""

from __future__ import annotations

import pytest

from colibri import resources


def test_the_data_packages_are_real_folders() -> None:
    assert (resources.spec_dir() / "protocol.json").is_file()
    assert (resources.fixture_model_dir("glm5-tiny") / "config.json").is_file()


def test_missing_package_data_is_named() -> None:
    with pytest.raises(FileNotFoundError, match="colibri.no_such_data is not installed"):
        resources._package_dir("colibri.no_such_data")
