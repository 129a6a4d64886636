"""colibri.engine: the engine process (control plane), backend-agnostic.

Mux and legacy loops, slots and prefix reuse, wire I/O, SUBMIT parsing, persistence, tier and
usage telemetry, sampling. It drives a ``Backend`` (``colibri.engine.backend``) found by name
through ``colibri.engine.registry``, and imports no backend module itself. Written so mypyc
can compile it: no monkeypatched seams, no dynamic attributes.
"""
