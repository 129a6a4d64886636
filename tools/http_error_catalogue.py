"""The error catalogue of spec/http.md, read from the server's sources.

Every ``bad(...)`` and ``APIError(...)`` call in ``server/`` becomes one table row (status,
message, param, code, where). ``make_http_spec.py`` writes the table between the catalogue
markers of spec/http.md, so the document cannot fall behind the code.
"""

from __future__ import annotations

import ast
from pathlib import Path

START = "<!-- error-catalogue:start -->"
END = "<!-- error-catalogue:end -->"


def _text(node: ast.expr | None) -> str | None:
    if node is None:
        return None
    if isinstance(node, ast.Constant):
        return None if node.value is None else str(node.value)
    if isinstance(node, ast.JoinedStr):
        out = ""
        for part in node.values:
            if isinstance(part, ast.Constant):
                out += str(part.value)
            elif isinstance(part, ast.FormattedValue):
                out += "{" + ast.unparse(part.value) + "}"
        return out
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return "{" + ast.unparse(node) + "}"


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def rows(server_dir: Path) -> list[tuple[str, str, str, str, str]]:
    found = []
    for path in sorted(server_dir.glob("*.py")):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            if node.func.id == "bad":
                status = "400"
                message = _text(node.args[0]) if node.args else None
                param = _text(node.args[1]) if len(node.args) > 1 else _text(
                    _keyword(node, "param"))
                code = _text(node.args[2]) if len(node.args) > 2 else _text(
                    _keyword(node, "code"))
            elif node.func.id == "APIError":
                status = ast.unparse(node.args[0]) if node.args else "?"
                message = _text(node.args[1]) if len(node.args) > 1 else None
                param, code = _text(_keyword(node, "param")), _text(_keyword(node, "code"))
            else:
                continue
            if message is None:
                continue
            found.append((status, message, param or "null", code or "null", path.stem))
    return sorted(set(found), key=lambda r: (r[0], r[4], r[1]))


def table(server_dir: Path) -> str:
    lines = ["| status | message | param | code | module |", "|---|---|---|---|---|"]
    for status, message, param, code, module in rows(server_dir):
        shown = message.replace("|", "\\|").replace("`", "'")
        lines.append(f"| {status} | {shown} | `{param}` | `{code}` | {module} |")
    return "\n".join(lines)


def render(document: str, server_dir: Path) -> str:
    head, _, rest = document.partition(START)
    _, _, tail = rest.partition(END)
    return f"{head}{START}\n{table(server_dir)}\n{END}{tail}"
