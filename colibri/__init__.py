"""colibri: reference implementation and conformance suite for GLM-5-class MoE inference.

The sub-packages mirror the repository's top-level folders:
``colibri.reference`` (plain-numpy engine), ``colibri.accelerated`` (compiled engine),
``colibri.server`` (HTTP gateway), ``colibri.conformance`` (the suite), ``colibri.spec``
(normative data) and ``colibri.fixtures`` (oracle fixtures).
"""

# The one place the version is written: pyproject.toml reads it from here (setuptools'
# `attr`, statically), so an installed distribution and the source tree always agree, and
# importing the package stays cheap (importlib.metadata was 47 ms of every engine's start).
__version__ = "0.1.0"

__all__ = ["__version__"]
