"""colibri: reference implementation and conformance suite for GLM-5-class MoE inference.

The sub-packages mirror the repository's top-level folders:
``colibri.reference`` (plain-numpy engine), ``colibri.accelerated`` (compiled engine),
``colibri.server`` (HTTP gateway), ``colibri.conformance`` (the suite), ``colibri.spec``
(normative data) and ``colibri.fixtures`` (oracle fixtures).
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("colibri")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__"]
