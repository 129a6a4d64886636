"""Safe probes for an engine that announces no capabilities (no CAPS line).

One throwaway engine serves one short seed-form request (six SUBMIT fields, nothing an
engine of the seed's era could misread) and one STOP of an id that was never sent. What
comes back shows, without assuming anything:

- ``accept``: the SUBMIT was answered ACCEPT before its DATA;
- ``prof``: a PROF line came right before the DONE;
- ``stop``: the STOP was answered ``ERROR <id> NOT_FOUND`` (an engine without STOP answers
  ``ERROR 0 BAD_REQUEST``, as for any unknown line).

The probe also shows that the engine serves requests at all: one that finishes its handshake
but sends no frame for the probe's SUBMIT raises ``EngineUnresponsive``, so a run against it
ends with one message instead of every case waiting out its timeout.

Nothing else is probed: an extension that could change or break the engine's state when it
is not understood (ids=1, logprobs, persistence switches) is known only from CAPS or from
the target description.
"""

from __future__ import annotations

from colibri.conformance.engine import (
    EngineError,
    EngineSession,
    EngineTarget,
    EngineUnresponsive,
)
from colibri.conformance.prompts import PromptCodec

from colibri.protocol import SubmitRequest
from colibri.protocol.records import Stop, Submit

PROBE_ID = 7
UNKNOWN_ID = 424243


def probe_turn(target: EngineTarget, codec: PromptCodec, timeout: float) -> set[str]:
    payload = codec.encode("Hello").data
    session = EngineSession(target, {"kv_slots": 1})
    found: set[str] = set()
    try:
        session.start()
        start = len(session.frames)
        # ids=1 only when the caller chose id payloads (--prompts ids): it then knows the
        # engine takes them; otherwise the request is the seed's six fields.
        ext = {"ids": 1} if codec.ids_mode else {}
        session.send(Submit(PROBE_ID, SubmitRequest(0, payload, 2, 0.0, 1.0,
                                                    extensions=ext)).encode())
        try:
            session.wait_for(
                lambda f: f.kind in ("DONE", "ERROR") and f.request_id == PROBE_ID,
                timeout, "the probe request's DONE", start=start,
            )
        except EngineError as exc:
            if session.alive and not any(f.request_id == PROBE_ID
                                           for f in session.frames[start:]):
                raise EngineUnresponsive(
                    f"the engine finished its handshake but sent no frame for a one-token "
                    f"SUBMIT within {timeout:.0f}s ({exc}): it is not serving requests, so "
                    "no case was run"
                ) from exc
            raise
        turn = [f for f in session.frames[start:] if f.kind not in ("HITS", "REPIN")]
        kinds = [f.kind for f in turn]
        mine = [f.kind for f in turn if f.request_id == PROBE_ID]
        if mine and mine[0] == "ACCEPT":
            found.add("accept")
        if len(kinds) >= 2 and kinds[-1] == "DONE" and kinds[-2] == "PROF":
            found.add("prof")
        after = len(session.frames)
        session.send(Stop(UNKNOWN_ID).encode())
        answer = session.wait_for(lambda f: f.kind == "ERROR", timeout, "the STOP's answer",
                                  start=after)
        if answer.request_id == UNKNOWN_ID and answer.fields[2:3] == ["NOT_FOUND"]:
            found.add("stop")
        session.close_stdin()
        session.await_exit(timeout)
    except EngineUnresponsive:
        raise
    except EngineError:
        # An engine that cannot serve the probe shows nothing: no extension is assumed.
        return found
    finally:
        session.close()
    return found
