"""pytest plugin: the protocol conformance suite as tests of another project's pytest run.

Registered through the ``pytest11`` entry point (pyproject.toml), so installing colibri is
enough::

    pytest --colibri-engine-cmd "./my-engine" --colibri-model fixtures/glm5-tiny
    pytest --colibri-target my-engine.target.json --colibri-model DIR --colibri-profile core

Without ``--colibri-engine-cmd`` or ``--colibri-target`` the plugin adds nothing. Each case
becomes one test named by its stable case id; the whole suite runs once, the first time a
case's verdict is needed. A case the target lacks a capability for is skipped with the
missing capability; an expected failure (``--colibri-expectations``) is xfailed; a failing
`must` case fails; a failing `should` case is xfailed unless ``--colibri-strict``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from colibri.conformance.capabilities import COLIBRI, CORE, SERVE_CODEC
from colibri.conformance.cases import Case, load_cases
from colibri.conformance.expectations import Expectations
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL, XPASS, Result
from colibri.conformance.runner import run_parallel, select_cases

_VERDICTS = pytest.StashKey[dict[str, Result]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("colibri-conformance", "colibri protocol conformance suite")
    group.addoption("--colibri-engine-cmd", help="engine command line to test")
    group.addoption("--colibri-target", type=Path,
                    help="target description file (spec/conformance-target.schema.json)")
    group.addoption("--colibri-model", type=Path, help="model directory (sent as SNAP)")
    group.addoption("--colibri-profile", choices=(CORE, COLIBRI, SERVE_CODEC), default=COLIBRI,
                    help="only the core or the serve_codec profile's cases, or every case "
                    "(colibri, the default)")
    group.addoption("--colibri-cases", action="append", default=[],
                    help="glob over case ids or areas (repeatable)")
    group.addoption("--colibri-expectations", type=Path,
                    help="expectations file of the target (known deviations)")
    group.addoption("--colibri-jobs", type=int, default=2, help="engines side by side")
    group.addoption("--colibri-strict", action="store_true",
                    help="a failing should case fails too")


def _enabled(config: pytest.Config) -> bool:
    return bool(config.getoption("colibri_engine_cmd") or config.getoption("colibri_target"))


def _cases(config: pytest.Config) -> list[Case]:
    cases = select_cases(load_cases("protocol"), config.getoption("colibri_cases"))
    profile = config.getoption("colibri_profile")
    if profile in (CORE, SERVE_CODEC):
        cases = [c for c in cases if c.profile == profile]
    return cases


class ConformanceCase(pytest.Item):
    def __init__(self, *, case: Case, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case = case
        self.add_marker(pytest.mark.colibri_conformance)

    def runtest(self) -> None:
        result = _verdicts(self.config)[self.case.id]
        status, level = result.status, self.case.level
        if status == SKIP:
            pytest.skip(result.message)
        if status == XFAIL:
            pytest.xfail(result.message)
        if status in (FAIL, ERROR, XPASS):
            if level == "should" and status != XPASS and not self.config.getoption(
                "colibri_strict"
            ):
                pytest.xfail(f"[should] {result.message}")
            pytest.fail(f"[{level}] {self.case.clause}: {result.message}", pytrace=False)
        assert status == PASS

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"{self.case.id} [{self.case.profile}, {self.case.level}]"


class ConformanceSuite(pytest.Collector):
    """The suite's cases as items, under one node named after the suite."""

    def collect(self) -> list[pytest.Item]:
        return [ConformanceCase.from_parent(self, name=c.id, case=c) for c in _cases(self.config)]


def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    if not _enabled(config):
        return
    suite = ConformanceSuite.from_parent(session, name="colibri-conformance-protocol")
    items.extend(item for item in suite.collect() if isinstance(item, pytest.Item))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "colibri_conformance: a case of the colibri protocol conformance suite"
    )


def _verdicts(config: pytest.Config) -> dict[str, Result]:
    if _VERDICTS in config.stash:
        return config.stash[_VERDICTS]
    from colibri.conformance.protocol_target import protocol_runner
    from colibri.conformance.target_file import TargetDescription

    description_file = config.getoption("colibri_target")
    description = TargetDescription.load(description_file) if description_file else None
    expectations_file = config.getoption("colibri_expectations") or (
        description.expectations if description is not None else None
    )
    model = config.getoption("colibri_model")
    runner = protocol_runner(
        config.getoption("colibri_engine_cmd") or "", model.resolve() if model else None,
        description=description,
    )
    results = run_parallel(runner, _cases(config), Expectations.load(expectations_file),
                           jobs=config.getoption("colibri_jobs"))
    config.stash[_VERDICTS] = {r.case_id: r for r in results}
    return config.stash[_VERDICTS]
