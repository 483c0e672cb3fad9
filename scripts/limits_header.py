"""Print, write (--write) or check (--check) csrc/limits.h, the C++ side of bundle/limits.py's shared limits.

    python scripts/limits_header.py --write     # after changing a shared limit or the plan version
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's flyship (flyship/__init__ maps it)

from flyship.bundle import limits  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(limits.main())
