"""flyship: one import name, ``flyship``; the source folders map onto its subpackages.

    compiler/ -> flyship.compiler   (compile stage; needs flydsl / triton: ``pip install .[compiler]``)
    bundle/   -> flyship.bundle     (the contract: manifest, schema, code-object readers)
    loader/   -> flyship.loader     (workload side: torch + ninja, never flydsl)
    csrc/     -> flyship/csrc       (C++ launch core, compiled by the loader at first use)
"""

import re
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent
VERSION = re.search(r'__version__ = "([^"]+)"', (HERE / "flyship" / "version.py").read_text()).group(1)

# Each source folder and every subpackage in it (found, so a new subpackage cannot be left out).
PACKAGE_DIR = {"flyship": "flyship", "flyship.csrc": "csrc"}
for folder in ("bundle", "compiler", "loader"):
    PACKAGE_DIR[f"flyship.{folder}"] = folder
    for sub in find_packages(where=str(HERE / folder)):
        PACKAGE_DIR[f"flyship.{folder}.{sub}"] = str(Path(folder, *sub.split(".")))
PACKAGES = sorted(PACKAGE_DIR)

setup(
    name="flyship",
    version=VERSION,
    description="Compile FlyDSL kernels to code-object bundles; run them as torch ops in another Python",
    long_description=(HERE / "README.md").read_text() if (HERE / "README.md").exists() else "",
    long_description_content_type="text/markdown",
    python_requires=">=3.10",
    packages=PACKAGES,
    package_dir=PACKAGE_DIR,
    package_data={"flyship.bundle": ["schema.json"], "flyship.csrc": ["*.cpp", "*.h"]},
    install_requires=["torch>=2.4", "ninja", "msgpack>=1.0", "pyelftools>=0.30", "filelock>=3.12", "click>=8.1"],
    extras_require={
        # The compile stage, installed next to the FlyDSL the user's Python already has: never flydsl
        # itself (flyc-build checks its version at start-up: 0.1.5 to 0.5.0, docs/flydsl-versions.md).
        # numpy: every flydsl release imports it without declaring it.
        "compiler": ["numpy", "jsonschema>=4"],
        # The emulated device (FLYSHIP_FLAVOR=emulate, flyship verify --emulate): numpy runs a wavefront's lanes.
        "emulate": ["numpy"],
        "triton": ["triton==3.6.0"],
        # flyc-build --executor ray[:ADDRESS]: compile tasks on a Ray cluster (local builds need no Ray).
        "ray": ["ray>=2.9"],
        # flyship pack --sign / load(trusted_keys=): Ed25519 signatures over a pack's index (docs/security.md).
        "sign": ["cryptography>=42"],
        "test": ["pytest>=7", "jsonschema>=4", "numpy", "expecttest", "hypothesis>=6", "cryptography>=42"],
    },
    entry_points={
        "console_scripts": [
            "flyc-build=flyship.compiler.cli:run",
            "flyship=flyship.loader.tools.cli:main",
        ]
    },
)
