"""Hubs stay cut by job: no product Python file over 600 lines and no function over 80, in Python or in csrc/ C++
(issue 21). A file or a
function past these is a sign that two jobs share a home: split it by job rather than raising the numbers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu
FOLDERS = ("flyship", "bundle", "compiler", "loader")
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_no_product_file_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in sources() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"files over {MAX_FILE_LINES} lines (split by job): {long}"


def test_no_product_function_is_over_80_lines():
    long = {}
    for p in sources():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES:
                    long[f"{p.relative_to(ROOT)}:{node.name}"] = n
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines (cut into steps): {long}"


# C++ (csrc/): the same 80-line limit per function, found by matching braces (comments and literals blanked).
# Generated headers (scripts/limits_header.py) are excepted.
CXX_GENERATED = ("limits.h", "plan_fields.h")
_CXX_CONTAINER = re.compile(r"\b(namespace|class|struct|union|enum)\b[^()]*$")


def _cxx_blank(text: str) -> str:
    """``text`` with comments and string/char literals blanked (newlines kept), so braces in them do not count."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|R"([^(\s]*)\(.*?\)\1"|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'',
                         re.S)
    return pattern.sub(lambda m: re.sub(r"[^\n]", " ", m.group(0)), text)


def cxx_functions(text: str) -> list[tuple[str, int, int]]:
    """(name, first line, lines) of every function body in C++ ``text`` (lambdas count with their function)."""
    s = _cxx_blank(text)
    stack: list[tuple[str, int, str]] = []  # (kind, first line, name) per open brace
    found = []
    last = 0  # just after the last ; { or } outside function bodies
    for i, c in enumerate(s):
        in_function = any(kind == "function" for kind, _, _ in stack)
        if c == "{":
            header = s[last:i].strip()
            if in_function or "(" not in header or header.endswith("="):
                kind = "block"
            else:
                kind = "block" if _CXX_CONTAINER.search(header) else "function"
            first = s.count("\n", 0, last + len(s[last:i]) - len(s[last:i].lstrip())) + 1
            name = re.search(r"([~\w:]+)\s*\(", header)
            stack.append((kind, first, name.group(1) if name else "?"))
            last = i + 1
        elif c == "}" and stack:
            kind, first, name = stack.pop()
            if kind == "function":
                found.append((name, first, s.count("\n", 0, i) + 2 - first))
            last = i + 1
        elif c == ";" and not in_function:
            last = i + 1
    return found


def test_the_cxx_function_scan_measures_bodies_and_skips_comments_and_literals():
    text = 'namespace a {\nstruct S {\n  int f() const {\n    return 1;  // }\n  }\n};\nvoid g(int x) {\n' \
           '  auto h = [](int y) { return y; };\n  const char* s = "}{";\n}\n}  // namespace a\n'
    assert cxx_functions(text) == [("f", 3, 3), ("g", 7, 4)]


def test_no_cxx_function_is_over_80_lines():
    long = {}
    for p in sorted((ROOT / "csrc").glob("*")):
        if p.suffix in (".cpp", ".h") and p.name not in CXX_GENERATED:
            for name, first, n in cxx_functions(p.read_text()):
                if n > MAX_FUNCTION_LINES:
                    long[f"csrc/{p.name}:{first} {name}"] = n
    assert not long, f"C++ functions over {MAX_FUNCTION_LINES} lines (cut into steps): {long}"
