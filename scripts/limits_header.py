"""Print, write (--write) or check (--check) the generated C++ headers: csrc/limits.h (bundle/limits.py's shared
limits and plan version) and csrc/plan_fields.h (bundle/plan_contract.py's plan keys).

    python scripts/limits_header.py --write     # after changing a shared limit, the plan version or a plan key
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's flyship (flyship/__init__ maps it)

from flyship.bundle import limits, plan_contract  # noqa: E402

# header name in csrc/ -> (its text, the table it is generated from)
HEADERS = {
    limits.HEADER: (limits.cxx_header, "bundle/limits.py"),
    plan_contract.HEADER: (plan_contract.cxx_header, "bundle/plan_contract.py"),
}


def main(argv: "list[str]") -> int:
    mode = argv.pop(0) if argv and argv[0] in ("--write", "--check") else "--print"
    csrc = Path(argv[0]) if argv else Path(__file__).resolve().parents[1] / "csrc"
    stale = 0
    for name, (generate, table) in HEADERS.items():
        text, path = generate(), csrc / name
        if mode == "--print":
            sys.stdout.write(text)
        elif mode == "--write":
            path.write_text(text)
        elif not path.is_file() or path.read_text() != text:
            print(f"{path}: not what {table} generates; run `python scripts/limits_header.py --write`",
                  file=sys.stderr)
            stale = 1
    return stale


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
