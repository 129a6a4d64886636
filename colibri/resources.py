"""One place that knows where colibri's package data lives.

Everything shipped as data (the normative ``spec/`` folder and the small committed fixture
models) is found through the import system (the data package's search location), so an
installed wheel and an editable checkout behave the same. Callers get real filesystem paths
because the engines memory-map model files.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

#: The model `colibri serve`, `colibri engine` and `colibri generate` use when none is given:
#: glm5-chat-small, trained here (fixtures/train_chat_small.py). glm5-chat-tiny, the random-
#: weight model it replaced, stays as an oracle fixture.
DEFAULT_MODEL_NAME = "glm5-chat-small"

#: Environment variable that overrides the default model directory (used by doctor's tests
#: and by anyone who wants a different default without passing --model everywhere).
DEFAULT_MODEL_ENV = "COLIBRI_DEFAULT_MODEL"


def _package_dir(package: str) -> Path:
    # importlib.util rather than importlib.resources (~20 ms to import, in every engine start):
    # both wheel installs and setuptools' editable finder give a data package a real search
    # directory; a zipped install would not, and the engines need files they can memory-map.
    spec = importlib.util.find_spec(package)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if not locations:
        raise FileNotFoundError(f"package data {package} is not installed (reinstall colibri)")
    path = Path(locations[0])
    if not path.is_dir():
        raise FileNotFoundError(f"package data for {package} is not a directory: {path}")
    return path


def spec_dir() -> Path:
    """The normative ``spec/`` folder (protocol.json, schemas, model.md, ...)."""
    return _package_dir("colibri.spec")


def spec_path(*parts: str) -> Path:
    """A file inside ``spec/``; raises FileNotFoundError naming it when absent."""
    path = spec_dir().joinpath(*parts)
    if not path.exists():
        raise FileNotFoundError(f"spec file missing from the installation: {path}")
    return path


def fixtures_dir() -> Path:
    """The committed fixtures folder (``fixtures/``)."""
    return _package_dir("colibri.fixtures")


def fixture_model_dir(name: str) -> Path:
    """The directory of a committed fixture model, e.g. ``glm5-tiny``."""
    return fixtures_dir() / "models" / name


def default_model_dir() -> Path:
    """The embedded default model, unless ``COLIBRI_DEFAULT_MODEL`` points elsewhere."""
    override = os.environ.get(DEFAULT_MODEL_ENV)
    if override:
        return Path(override)
    return fixture_model_dir(DEFAULT_MODEL_NAME)


#: Where `colibri atlas analyze --web` writes the dashboard's atlas and `colibri serve`
#: serves it as `/experts.json` (a state path: a dashboard build replaces web/dist).
ATLAS_ENV = "COLI_ATLAS"


def atlas_path() -> Path:
    """``$COLI_ATLAS``, else ``$XDG_STATE_HOME/colibri/experts.json`` (~/.local/state)."""
    override = os.environ.get(ATLAS_ENV)
    if override:
        return Path(override)
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "colibri" / "experts.json"
