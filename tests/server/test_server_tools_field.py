"""`tools` / `functions` field rules (spec/http.md §4.3)."""

from __future__ import annotations

from typing import Any

import pytest
from colibri.server.errors import APIError
from colibri.server.template import check_continuation
from colibri.server.validation import validate_tools

WEATHER = [{"type": "function", "function": {"name": "get_weather"}}]


@pytest.mark.parametrize("tools", [{}, False, 0, "", {"name": "x"}, 1, "tools"])
def test_non_array_tools_are_refused(tools: Any) -> None:
    with pytest.raises(APIError) as caught:
        validate_tools({"tools": tools, "functions": WEATHER})
    assert caught.value.status == 400
    assert caught.value.param == "tools" and caught.value.code == "invalid_value"
    assert "`tools` must be an array." in caught.value.message


def test_empty_tools_means_no_tools_even_beside_functions() -> None:
    assert validate_tools({"tools": []}) is None
    assert validate_tools({"tools": [], "functions": WEATHER}) is None
    assert validate_tools({"tools": [], "functions": []}) is None


def test_functions_are_read_only_without_tools() -> None:
    assert validate_tools({"functions": WEATHER}) == WEATHER
    assert validate_tools({"tools": None, "functions": WEATHER}) == WEATHER
    assert validate_tools({"tools": WEATHER, "functions": [{"name": "other"}]}) == WEATHER
    with pytest.raises(APIError):
        validate_tools({"functions": []})


def test_continuation_sees_the_same_tools() -> None:
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    body = {"tools": [], "functions": WEATHER, "messages": messages}
    check_continuation(messages, body)  # no tools are active: nothing to refuse


def test_lenient_tool_spec_is_shared_and_never_raises() -> None:
    from colibri.server.validation import lenient_tool_spec

    spec = lenient_tool_spec({"tools": WEATHER, "tool_choice": "required"})
    assert spec is not None and spec.functions == (WEATHER[0]["function"],)
    # Invalid declarations render no tools; shaping() reports the error in its place.
    assert lenient_tool_spec({"tools": WEATHER, "tool_choice": "sometimes"}) is None
    assert lenient_tool_spec({"tools": {}}) is None
    assert lenient_tool_spec({}) is None
