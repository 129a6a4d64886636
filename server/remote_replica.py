"""A replica's engine on a node of a Ray cluster: ``colibri serve --replicas N
--replica-cluster ray[:ADDRESS]``.

The gateway runs this module as each replica's engine command (``python -m
colibri.server.remote_replica --cluster SPEC -- ENGINE_ARGV...``), so its supervisor, its
restarts and its frame reader stay exactly as they are for a local engine. This process, the
relay, asks Ray for an :class:`EngineHost` actor on the replica's node, which starts the engine
there with the relay's environment and serves the engine's stdin and stdout as one TCP
connection; the relay then copies its own stdin to that connection and the connection to its
stdout. Frames cross one TCP hop and no Ray call (a remote call per relayed frame costs more
than a small model's decode step, spec/DEVIATIONS.md "Replicas"); Ray places the engine and
tells the relay when the node or the actor is lost.

Placement: the cluster's alive nodes in the order of their ids, replica ``i``
(``COLI_REPLICA_INDEX``) on node ``i mod nodes``, held to it (Ray's soft preference let two
replicas started together land on one node); a lost node's replica comes back on another,
because its relay exits and the next one counts the nodes alive then. Every node must hold the
model and colibri at the paths the gateway uses (the same install everywhere, as for the
expert workers; docs/cluster.md).

Lifetimes: the engine dies with its actor and the relay with the gateway
(``PR_SET_PDEATHSIG``), the actor with the relay (Ray ends an actor whose owner is gone), and
the relay ends when the engine's output ends,
with the engine's exit status, or with status 1 when the connection or the actor is lost. The
gateway's supervisor then starts a new relay, which places a new actor.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

#: The environment variable that tells a replica's engine command which replica it is.
REPLICA_INDEX = "COLI_REPLICA_INDEX"
#: Ray's namespace for the replica actors; a name holds the gateway's pid and the index, so
#: two gateways on one cluster never share an actor.
NAMESPACE = "colibri"
#: How long a host waits for its engine to leave after the relay went away, before killing it.
ENGINE_GRACE_S = 5.0
CHUNK = 1 << 16
PR_SET_PDEATHSIG = 1


def remote_replica_argv(cluster: str, engine_argv: Sequence[str]) -> list[str]:
    """The engine command that runs ``engine_argv`` on a node of ``cluster`` (this relay)."""
    return [sys.executable, "-m", "colibri.server.remote_replica", "--cluster", cluster, "--",
            *engine_argv]


def actor_name(gateway_pid: int, index: int) -> str:
    return f"colibri-replica-{gateway_pid}-{index}"


def _die_with_parent() -> None:
    """SIGKILL for this process when its parent dies: the engine (set before its exec) when
    its actor's process goes, the relay when the gateway goes."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class EngineHost:
    """The engine of one replica, on its node, behind one TCP connection (a Ray actor)."""

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.listener = socket.create_server(("", 0))
        self.port = self.listener.getsockname()[1]
        self.process = subprocess.Popen(list(argv), stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, env=env,
                                        preexec_fn=_die_with_parent)
        threading.Thread(target=self._serve, daemon=True).start()

    def address(self) -> tuple[str, int, int]:
        """(this node's IP, the port the engine is served on, the engine's pid)."""
        return str(_ray().util.get_node_ip_address()), self.port, self.process.pid

    def node(self) -> str:
        return str(_ray().get_runtime_context().get_node_id())

    def exit_status(self) -> int:
        """The engine's exit status, once it has exited."""
        return self.process.wait()

    def _serve(self) -> None:
        """One connection (the relay's): its bytes to the engine's stdin, the engine's
        stdout to it; when the relay goes, the engine's stdin closes (the protocol's
        graceful shutdown) and the engine is killed if it has not left within the grace."""
        conn, _ = self.listener.accept()
        self.listener.close()
        _no_delay(conn)
        stdin, stdout = self.process.stdin, self.process.stdout
        assert stdin is not None and stdout is not None
        threading.Thread(target=_copy, args=(conn.recv, stdin.write, stdin.flush, stdin.close),
                         daemon=True).start()
        _copy(lambda n: os.read(stdout.fileno(), n), conn.sendall, lambda: None,
              lambda: _shutdown_write(conn))  # the engine's output ended
        try:
            self.process.wait(ENGINE_GRACE_S)
        except subprocess.TimeoutExpired:
            self.process.kill()


def _ray() -> Any:
    """Ray, imported only where a replica is placed (it ships no type stubs: held as Any)."""
    import ray

    return ray


def _no_delay(conn: socket.socket) -> None:
    """Send each frame at once: with Nagle's algorithm a small frame waits for the peer's
    delayed acknowledgement (about 40 ms a token on Linux)."""
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def _shutdown_write(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)


def _copy(read: Callable[[int], bytes], write: Callable[[bytes], Any],
          flush: Callable[[], Any], done: Callable[[], Any]) -> None:
    """Bytes from ``read`` to ``write`` until EOF or a broken end, then ``done``."""
    try:
        while chunk := read(CHUNK):
            write(chunk)
            flush()
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            done()


def _nodes(ray: Any) -> list[str]:
    return sorted(str(n["NodeID"]) for n in ray.nodes() if n.get("Alive"))


def _place(ray: Any, index: int, argv: list[str], env: dict[str, str]) -> Any:
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = _nodes(ray)
    if not nodes:
        raise RuntimeError("the Ray cluster has no alive node")
    host = ray.remote(EngineHost).options(
        name=actor_name(os.getppid(), index), namespace=NAMESPACE, num_cpus=0,
        max_restarts=0, scheduling_strategy=NodeAffinitySchedulingStrategy(
            nodes[index % len(nodes)], soft=False))
    return host.remote(argv, env)


def _write_all(fd: int) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]

    return write


def relay(cluster: str, argv: list[str], stdin_fd: int = 0, stdout_fd: int = 1) -> int:
    """Run ``argv`` as this replica's engine on its node, its stdin and stdout this
    process's; the engine's exit status, or 1 when its host is lost."""
    kind, sep, address = cluster.partition(":")
    if kind != "ray" or (sep and not address):
        print(f"--replica-cluster {cluster!r}: expected ray or ray:ADDRESS", file=sys.stderr)
        return 2
    env = dict(os.environ)  # the replica's environment, before Ray adds its own
    index = int(env.get(REPLICA_INDEX, "0"))
    _die_with_parent()
    # Frames go to a private copy of stdout; whatever Ray's driver prints goes to stderr, the
    # engine's log, never into the protocol stream.
    frames = os.dup(stdout_fd)
    os.dup2(2, stdout_fd)
    ray = _ray()
    ray.init(address=address or "auto", namespace=NAMESPACE, log_to_driver=False,
             logging_level=logging.WARNING)
    host = _place(ray, index, argv, env)
    try:
        ip, port, pid = ray.get(host.address.remote())
        print(f"[replica {index}] engine pid {pid} on {ip} (node {ray.get(host.node.remote())})",
              file=sys.stderr, flush=True)
        conn = socket.create_connection((ip, port))
        _no_delay(conn)
        threading.Thread(target=_copy, daemon=True, args=(
            lambda n: os.read(stdin_fd, n), conn.sendall, lambda: None,
            lambda: _shutdown_write(conn))).start()
        _copy(conn.recv, _write_all(frames), lambda: None, lambda: None)
        return int(ray.get(host.exit_status.remote(), timeout=ENGINE_GRACE_S + 5))
    except (ray.exceptions.RayError, OSError) as exc:
        print(f"[replica {index}] lost its engine host: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)
        return 1
    finally:
        with contextlib.suppress(Exception):
            ray.kill(host)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="run a replica's engine on a node of a Ray cluster (internal: the "
                    "gateway's engine command under --replica-cluster)")
    parser.add_argument("--cluster", required=True, help="ray or ray:ADDRESS")
    parser.add_argument("engine", nargs=argparse.REMAINDER, help="-- ENGINE_ARGV...")
    args = parser.parse_args(argv)
    engine = args.engine[1:] if args.engine[:1] == ["--"] else args.engine
    if not engine:
        parser.error("no engine command after --")
    return relay(args.cluster, engine)


if __name__ == "__main__":
    sys.exit(main())
