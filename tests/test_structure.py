"""Hubs stay cut by job: no product file (Python, or csrc/ C++) over 560 lines and no function over 80, in Python
or in csrc/ C++ (issues 21, 31). A file or a function past these is a sign that two jobs share a home: split it
by job rather than raising the numbers."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.cpu
FOLDERS = ("flyship", "bundle", "compiler", "loader")
MAX_FILE_LINES = 560
MAX_FUNCTION_LINES = 80


def sources() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py"))


def test_no_product_file_is_over_560_lines():
    files = [*sources(), *sorted((ROOT / "csrc").glob("*.cpp")), *sorted((ROOT / "csrc").glob("*.h"))]
    long = {str(p.relative_to(ROOT)): n for p in files if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
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


MAX_EXCEPTION_CLASSES = 20
# Where a user learns a class's name: the public modules' exports (flyship.errors, flyship, flyship.loader) and docs/.
EXPORTING = ("flyship/errors.py", "flyship/__init__.py", "loader/__init__.py")


def exception_classes() -> dict[str, str]:
    """Every exception class the product defines: name -> where (a class whose base is a builtin exception or,
    transitively, another of these)."""
    import builtins

    known = {n for n in dir(builtins) if isinstance(getattr(builtins, n), type)
             and issubclass(getattr(builtins, n), BaseException)}
    classes = [(node, p) for p in sources() for node in ast.walk(ast.parse(p.read_text(), str(p)))
               if isinstance(node, ast.ClassDef)]
    found: dict[str, str] = {}
    while True:
        new = {n.name: f"{p.relative_to(ROOT)}:{n.lineno}" for n, p in classes if n.name not in found
               and any((b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", "")) in known | set(found)
                       for b in n.bases)}
        if not new:
            return found
        found.update(new)


def _told_apart_by_code() -> set[str]:
    """Names in an ``except`` clause or as ``isinstance``'s class argument anywhere in the product."""
    names: set[str] = set()

    def collect(node: ast.AST) -> None:
        for n in ast.walk(node):
            if isinstance(n, ast.Name):
                names.add(n.id)
            elif isinstance(n, ast.Attribute):
                names.add(n.attr)

    for p in sources():
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                collect(node.type)
            elif isinstance(node, ast.Call) and getattr(node.func, "id", "") == "isinstance" and len(node.args) == 2:
                collect(node.args[1])
    return names


def _exported_or_documented() -> set[str]:
    import re

    text = "\n".join((ROOT / p).read_text() for p in EXPORTING)
    text += "\n".join(p.read_text() for p in sorted((ROOT / "docs").glob("*.md")))
    text += "\n".join(p.read_text() for p in sorted((ROOT / "csrc").glob("*.cpp")))  # C++ raises by name
    return set(re.findall(r"[\"'`](\w+)[\"'`]", text))


def test_exception_classes_are_few_and_each_is_caught_or_public():
    classes = exception_classes()
    assert "FlyshipError" in classes and "CallTypeError" in classes  # the scan sees the tree it counts
    assert len(classes) <= MAX_EXCEPTION_CLASSES, (
        f"{len(classes)} exception classes, at most {MAX_EXCEPTION_CLASSES} (flyship/errors.py's policy: a class "
        f"only where code catches it or a user must tell it apart; fold the others into their parent, with a kind "
        f"where words tell them apart): {sorted(classes)}")
    seen = _told_apart_by_code() | _exported_or_documented()
    idle = {name: where for name, where in classes.items() if name not in seen}
    assert not idle, (f"exception classes that no code catches (except / isinstance) and no export or doc names: "
                      f"{idle}; fold each into its parent (flyship/errors.py)")
