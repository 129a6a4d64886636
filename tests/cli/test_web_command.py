"""`colibri web`: the serve flags plus --no-browser; the browser opens only once /health is 200."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Iterator

import pytest

from colibri.cli import build_parser
from colibri.commands import web


class _Health(http.server.BaseHTTPRequestHandler):
    answers: list[int] = []

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        code = self.answers.pop(0) if self.answers else 200
        self.send_response(code if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def health_server() -> Iterator[tuple[str, type[_Health]]]:
    handler = type("H", (_Health,), {"answers": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", handler
    server.shutdown()
    server.server_close()


def test_web_takes_the_serve_flags_and_no_browser() -> None:
    args = build_parser().parse_args(["web", "--no-browser", "--port", "8123", "--api-key", "k"])
    assert args.no_browser is True
    assert (args.port, args.api_key, args.host) == (8123, "k", "127.0.0.1")
    assert args.handler is web.run


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8000/"),
    ("0.0.0.0", "http://127.0.0.1:8000/"),
    ("::", "http://[::1]:8000/"),
    ("::1", "http://[::1]:8000/"),
    ("example.org", "http://example.org:8000/"),
])
def test_dashboard_url_reaches_wildcard_binds_over_loopback(host: str, url: str) -> None:
    assert web.dashboard_url(host, 8000) == url


def test_the_browser_opens_only_after_health_answers_200(
        health_server: tuple[str, type[_Health]]) -> None:
    url, handler = health_server
    handler.answers = [503, 503]  # engine restarting, then ready
    opened: list[str] = []

    def record(u: str) -> bool:
        opened.append(u)
        return True

    assert web.open_when_ready(url, opener=record, timeout_s=10)
    assert opened == [url]
    assert handler.answers == []


def test_no_browser_is_opened_when_the_server_never_gets_ready() -> None:
    opened: list[str] = []
    stop = threading.Event()
    stop.set()
    assert not web.open_when_ready("http://127.0.0.1:9/", opener=lambda u: bool(opened.append(u)),
                                   stop=stop)
    assert opened == []
