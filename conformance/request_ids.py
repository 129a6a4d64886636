"""Request ids as cases name them: a number or a string.

colibri's GLM dialect reads an id as an unsigned 64-bit number and echoes it canonically
(spec/protocol.md §2.2), so a case names it by its value. The serve_codec dialect of
colibri's family engines takes any run of non-blank bytes shorter than 64 and echoes it byte
for byte (§5.1), so a case names it by its text: ``007`` there is not ``7``.
"""

from __future__ import annotations

from colibri.conformance.frames import TAGGED_KINDS, Frame

#: A request id in a case: an int for the GLM dialect, a str for the serve_codec dialect.
RequestRef = int | str


def names(frame: Frame, ref: RequestRef) -> bool:
    """Does the frame carry this request's id, read the way its dialect reads ids?"""
    if isinstance(ref, int):
        return frame.request_id == ref
    if frame.kind not in TAGGED_KINDS:
        return False
    fields = frame.fields
    return len(fields) > 1 and fields[1] == ref
