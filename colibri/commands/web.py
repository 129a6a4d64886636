"""``colibri web``: ``colibri serve`` plus the dashboard opened in a browser once the engine
is ready. It serves exactly what ``colibri serve`` serves; ``--no-browser`` is for hosts
without a display (then point a browser at the printed address from another machine)."""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.error
import urllib.request
import webbrowser
from collections.abc import Callable

from colibri.commands import serve

#: How long to wait for the engine before giving up on opening the browser (the server runs on).
READY_TIMEOUT_S = 600.0


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "web", help="serve the API and the web dashboard, and open it in a browser",
        description="`colibri serve` plus opening the web dashboard (web/dist, built by "
                    "`make build`) in a browser when the engine is ready.")
    serve.add_arguments(parser)
    parser.add_argument("--no-browser", action="store_true",
                        help="do not open a browser (headless hosts)")
    parser.set_defaults(handler=run)


def dashboard_url(host: str, port: int) -> str:
    """Where a local browser reaches the server: wildcard binds are reached over loopback."""
    if host in ("", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host.strip('[]')}]"
    return f"http://{host}:{port}/"


def wait_ready(url: str, timeout_s: float = READY_TIMEOUT_S, interval_s: float = 0.25,
               stop: threading.Event | None = None) -> bool:
    """Poll ``/health`` until it answers 200 (the engine is READY); False on timeout or stop."""
    deadline = time.monotonic() + timeout_s
    health = url.rstrip("/") + "/health"
    while time.monotonic() < deadline and not (stop is not None and stop.is_set()):
        try:
            with urllib.request.urlopen(health, timeout=2.0) as res:
                if res.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(interval_s)
    return False


def open_when_ready(url: str, opener: Callable[[str], bool] = webbrowser.open,
                    timeout_s: float = READY_TIMEOUT_S,
                    stop: threading.Event | None = None) -> bool:
    if not wait_ready(url, timeout_s, stop=stop):
        return False
    print(f"colibri web: dashboard at {url}", file=sys.stderr, flush=True)
    if not opener(url):
        print(f"colibri web: no browser could be opened; visit {url}", file=sys.stderr,
              flush=True)
    return True


def run(args: argparse.Namespace) -> int:
    if not args.no_browser:
        if args.port == 0:
            print("colibri web: --port 0 picks the port at start; open the printed address "
                  "yourself", file=sys.stderr)
        else:
            url = dashboard_url(args.host, args.port)
            threading.Thread(target=open_when_ready, args=(url,), daemon=True,
                             name="colibri-web-open").start()
    return serve.run(args)
