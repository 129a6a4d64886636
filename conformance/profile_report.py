"""Per-profile verdicts: "fails the seed" kept apart from "lacks an extension".

A `core` case that fails is a departure from the seed protocol (serve_protocol.md); a
`colibri` case skipped because the target lacks its capability only says which extension
the target does not have; a `colibri` case that fails on a target claiming the capability
is a broken extension. `serve_codec` stands beside them: a case of colibri's family-engine
dialect skipped on a target that does not speak it only says so; one failing on a target that
declares the dialect is a broken dialect feature. spec/conformance.md, "Reading a report".
"""

from __future__ import annotations

from collections import Counter
from typing import TextIO

from colibri.conformance.capabilities import (
    CAPABILITIES,
    COLIBRI,
    CORE,
    SERVE_CODEC,
    TARGET_FACTS,
)
from colibri.conformance.outcome import ERROR, FAIL, PASS, SKIP, XFAIL, Result


def profile_counts(results: list[Result]) -> dict[str, dict[str, int]]:
    """For each profile: cases that pass, fail (incl. harness errors), are expected to fail,
    or are skipped. A `colibri` profile count includes the core cases (it extends core); the
    `serve_codec` count is its own cases only (a sibling dialect, not an extension)."""
    counts: dict[str, dict[str, int]] = {}
    nesting = ((CORE, {CORE}), (COLIBRI, {CORE, COLIBRI}), (SERVE_CODEC, {SERVE_CODEC}))
    for profile, members in nesting:
        tally: Counter[str] = Counter()
        for r in results:
            if r.profile in members:
                tally["fail" if r.status in (FAIL, ERROR) else r.status] += 1
        counts[profile] = {k: tally[k] for k in (PASS, "fail", XFAIL, SKIP)}
    return counts


def lacking(results: list[Result]) -> dict[str, int]:
    """Extension -> how many cases were skipped because the target lacks it."""
    tally: Counter[str] = Counter()
    for r in results:
        for name in r.lacks:
            tally[name] += 1
    return dict(sorted(tally.items()))


def write_profile_summary(results: list[Result], out: TextIO) -> None:
    # HTTP profiles (openai, anthropic, colibri) do not nest; report.py summarises them.
    if not any(r.profile for r in results if r.suite == "protocol"):
        return
    counts = profile_counts(results)
    out.write("\nprofiles        pass  fail xfail  skip\n")
    for profile, tally in counts.items():
        out.write(f"  {profile:<12}" + "".join(f"{tally[k]:>6}" for k in tally) + "\n")
    seed = [r for r in results if r.profile == CORE and r.blocking]
    broken = [r for r in results
              if r.profile in (COLIBRI, SERVE_CODEC) and r.status in (FAIL, ERROR)]
    out.write(f"\nfails the seed: {len(seed)} case(s)"
              + "".join(f"\n  {r.case_id} ({r.seed or r.clause})" for r in seed) + "\n")
    if broken:
        out.write(f"fails an extension it has: {len(broken)} case(s)"
                  + "".join(f"\n  {r.case_id} ({r.clause})" for r in broken) + "\n")
    missing = lacking(results)
    if missing:
        out.write("lacks an extension (cases skipped, not failed):\n")
        for name, number in missing.items():
            kind = "target fact" if name in TARGET_FACTS else CAPABILITIES[name].origin
            if name in CAPABILITIES and CAPABILITIES[name].profile == SERVE_CODEC:
                kind += " serve_codec dialect"
            out.write(f"  {name:<18} {number:>3} case(s)  [{kind}] "
                      f"{CAPABILITIES[name].summary if name in CAPABILITIES else ''}\n")
