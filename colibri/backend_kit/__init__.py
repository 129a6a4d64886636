"""The backend kit: what every backend shares that is not model math.

- ``kv_state.py``: a sequence's ``KVState`` (tokens, per-layer latent caches, hidden states,
  the MTP cache), the step's positions, and ``cache_widths`` (which arrays a layer keeps).
- ``kv_codec.py``: ``KvRecordCodec``, a ``KVState`` <-> COLIKV1 records (spec/protocol.md 4.3).
- ``row_driver.py``: ``RowModel``, the incremental API (``forward_rows``, ``prefill``,
  ``decode``, ``decode_batch``, ``mtp_draft``) over a backend's layer and head hooks.
- ``layer_steps.py``: ``SteppedRowModel``, the step wrapper: a layer as the backend's math
  steps (norms, attention, router, experts, residual), the phase clock read around them.
- ``tiered_expert_store.py``: routed experts on disk, in a RAM LRU, pinned, and in VRAM,
  with the REPIN ranking and the counters telemetry reports.
- ``phase_clock.py``: ``PhaseClock``, the seconds per phase that PERF and PROF report.
- ``kv_state_backend.py``: ``KVStateBackend``, the engine seam's bookkeeping for a backend
  whose states are ``KVState``s, and the step wrapper that reads the clock around the math.
- ``model_fingerprint.py``: the model tag of ``.coli_kv`` files.
- ``remote_experts.py``: ``RemoteExperts``, a layer's routed experts computed by expert workers
  (one call per owner per layer, outputs placed where the local computation puts them);
  ``expert_worker.py`` the worker; ``ray_cluster.py`` the workers as Ray actors (``--cluster``);
  ``expert_placement.py`` places experts on nodes by heat and memory (``colibri plan
  --nodes``), ``placement_file.py`` reads and writes that placement (``--cluster-placement``).

The kit imports numpy, the engine's ``Backend`` interface (``colibri.engine.backend``) and, from
``colibri.reference``, only pure data (config, tensor aliases, checkpoint and weight loaders);
model math a backend needs is its own, passed in through the row driver's hooks.
"""
