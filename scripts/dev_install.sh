#!/bin/sh
# Install this checkout, editable, into the Python $1 (make install runs it for both dev venvs).
#
# setuptools' editable install resolves `flyship` through a finder it appends to sys.meta_path, after Python's own
# path finder (pypa/setuptools#3557). A script run from the folder that holds the clone (named `flyship`) then
# imports the clone folder as an empty namespace package: `module 'flyship' has no attribute 'load'`. The checkout
# root on sys.path (one line in a .pth) lets the path finder find the real package there, which wins over a
# namespace folder wherever that sits on sys.path (flyship/__init__.py maps loader/, bundle/, compiler/ from it).
set -e
py="$1"
root="$(cd "$(dirname "$0")/.." && pwd)"
rm -rf "$root/build" "$root"/*.egg-info  # setuptools would reuse a stale build/ folder
"$py" -m pip install -q --no-deps --no-build-isolation -e "$root"
"$py" -c 'import pathlib, sys, sysconfig
pathlib.Path(sysconfig.get_paths()["purelib"], "flyship_checkout.pth").write_text(sys.argv[1] + "\n")' "$root"
rm -rf "$root/build" "$root"/*.egg-info
