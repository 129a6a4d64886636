"""Route attribution: a forward whose routing reports do not match its rows is said once."""

from __future__ import annotations

import io

from colibri.engine.route_attribution import RouteAttribution


def _mismatched_forward(routes: RouteAttribution) -> None:
    routes.begin([7, 8])  # two rows, but layer 1 reports only one selection
    routes.observe(1, (0, 1))
    routes.end()


def test_a_mismatched_forward_is_reported_once_and_credits_nothing() -> None:
    log = io.StringIO()
    routes = RouteAttribution([1], n_experts=4, log=log)
    _mismatched_forward(routes)
    _mismatched_forward(routes)
    assert log.getvalue().count("[API]") == 1
    assert "ENTROPY" in log.getvalue()
    assert routes.take_entropy(7) == [0.0]


def test_matching_forwards_say_nothing() -> None:
    log = io.StringIO()
    routes = RouteAttribution([1], n_experts=4, log=log)
    routes.begin([7, 8])
    routes.observe(1, (0, 1))
    routes.observe(1, (2, 3))
    routes.end()
    assert log.getvalue() == ""
    assert routes.take_entropy(7) == [1.0]  # two experts, once each
