"""Whether ``make build`` has compiled a current mypyc control plane (colibri.control_plane):
tests that run it skip, naming `make build`, only when it has not."""

from __future__ import annotations

import pytest

from colibri import control_plane


def compiled_built() -> bool:
    try:
        control_plane.check_current(control_plane.read_build())
    except control_plane.ControlPlaneError:
        return False
    return True


needs_compiled = pytest.mark.skipif(not compiled_built(),
                                    reason="no current mypyc build (`make build`)")
