"""colibri.conformance: the conformance suite for engines (stdio protocol) and servers (HTTP)."""
