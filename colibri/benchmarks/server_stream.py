"""Bench section ``server-stream``: tokens/s streamed through ``colibri serve`` against the
same engine driven alone, in one run (the measurement lives in ``colibri.server.bench``)."""

from __future__ import annotations

from colibri.server.bench import register_section

register_section()
