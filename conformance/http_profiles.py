"""HTTP profiles: which public contract a case holds a server to.

A *profile* names whose documentation a case is written from, so a report can say "fails
what OpenAI documents" apart from "lacks a colibri extension":

- ``openai``: what OpenAI's API reference guarantees for ``/v1/chat/completions``,
  ``/v1/completions`` and ``/v1/models`` (request validation, the error envelope and status
  codes, SSE framing and chunk shapes, usage and ``stream_options``, finish reasons, stop
  handling, ``n``/``logprobs``/``top_logprobs`` and tool-call shapes). Any
  OpenAI-compatible server is judged on it.
- ``anthropic``: what Anthropic's Messages API reference guarantees for ``/v1/messages``
  (content blocks, the SSE event sequence, ``stop_reason``, usage, errors).
- ``colibri``: colibri's own surface and extensions (spec/http.md): the stats object and
  frame, slots, the thinking split, System One, auth/Host/CORS specifics, admission,
  operations endpoints, colibri's exact error wording.

Within a profile a case still ``requires`` the capabilities it needs (``streaming``,
``completions``, ``tools``, ``auth``...), and a server that lacks one skips the case. A
behaviour that a documented-compatible server may legitimately do differently is a
``should`` (case or expectation level), which warns and never fails the run.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping

from colibri.conformance.cases import Case
from colibri.conformance.outcome import Result

#: The HTTP profiles, in report order.
HTTP_PROFILES = ("openai", "anthropic", "colibri")


def profile_counts(results: Iterable[Result]) -> dict[str, Counter[str]]:
    """Per profile, how many cases ended in each status, and how many warned (profiles in
    report order)."""
    counts: dict[str, Counter[str]] = {}
    for result in results:
        tally = counts.setdefault(result.profile or "(none)", Counter())
        tally[result.status] += 1
        # A passing case whose `should` expectations warned: compatible, but different.
        tally["warned"] += bool(result.warnings)
    order = {name: number for number, name in enumerate(HTTP_PROFILES)}
    return dict(sorted(counts.items(), key=lambda item: (order.get(item[0], 99), item[0])))


def describe(counts: Mapping[str, Counter[str]]) -> list[str]:
    """One line per profile: ``openai: 40 pass, 2 fail, 3 skip`` (zero counts left out)."""
    lines = []
    for profile, statuses in counts.items():
        parts = [f"{n} {status}" for status, n in sorted(statuses.items()) if n]
        parts = parts or ["no cases"]
        lines.append(f"{profile}: {', '.join(parts)}")
    return lines


def select_profiles(cases: Iterable[Case], profiles: Iterable[str]) -> list[Case]:
    """The cases of the named profiles (all cases when none is named)."""
    wanted = set(profiles)
    unknown = sorted(wanted - set(HTTP_PROFILES))
    if unknown:
        known = ", ".join(HTTP_PROFILES)
        raise ValueError(f"unknown profile(s) {', '.join(unknown)}; known: {known}")
    return [c for c in cases if not wanted or c.profile in wanted]
