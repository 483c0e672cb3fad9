"""docs/shipping.md's container recipe, replayed command by command without docker: build the kernels with the DSL,
pack and sign, prebuild the extension, then a runtime with no compiler checks the pack and loads it, signature
verified. The commands come from the doc's Dockerfile (and examples/shipping/Dockerfile must be that text), so the
doc and this test cannot drift; docs/shipping.md, "What proves it", lists the stand-ins."""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from flyship.bundle import signing

from tests.conftest import copy_checkout, flydsl_python

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "shipping.md"
DOCKERFILE = ROOT / "examples" / "shipping" / "Dockerfile"
MAPPED = ("/src", "/out", "/venv", "/opt", "/var", "/run")  # the image paths the recipe uses, under a stage root
_MAPPED_RE = re.compile(r"(?<=[\s\"'=])(" + "|".join(re.escape(m) for m in MAPPED) + r")(?=[/\s\"'\[]|$)")

pytestmark = pytest.mark.cpu


def fenced(text: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.S | re.M)


@dataclass
class Stage:
    name: str
    base: str  # the FROM image
    steps: list[tuple[str, str]] = field(default_factory=list)  # (instruction, arguments)


def parse(dockerfile: str) -> tuple[dict[str, str], list[Stage]]:
    """(the ARGs, the stages) of a Dockerfile: continuation lines joined, comments dropped."""
    args: dict[str, str] = {}
    stages: list[Stage] = []
    logical = re.sub(r"\\\n\s*", " ", dockerfile)
    for line in logical.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        instr, _, rest = line.partition(" ")
        if instr == "ARG" and not stages:
            k, _, v = rest.partition("=")
            args[k] = v
        elif instr == "FROM":
            words = rest.split()
            stages.append(Stage(words[2] if len(words) == 3 and words[1] == "AS" else f"stage{len(stages)}", words[0]))
        else:
            assert instr in ("RUN", "COPY", "ENV"), f"the replay does not know {instr!r}: teach it, or keep to these"
            stages[-1].steps.append((instr, rest))
    return args, stages


def make_python(root: Path, outer: list[str]) -> Path:
    """A scratch venv at ``root`` whose site-packages layer over ``outer`` (the dev venvs: they stand in for the
    package index and the image's preinstalled torch), with a ``pip`` command (venv --without-pip makes none)."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True, timeout=120)
    site = Path(subprocess.run([str(root / "bin" / "python"), "-c",
                                "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    site.joinpath("_outer.pth").write_text("".join(f"{o}\n" for o in outer))
    pip = root / "bin" / "pip"
    pip.write_text(f'#!/bin/sh\nexec "{root}/bin/python" -m pip "$@"\n')
    pip.chmod(0o755)
    return root / "bin" / "python"


def tools_dir(where: Path, names: tuple[str, ...]) -> Path:
    """A PATH folder holding only these commands (links to the system's): what a slim image has, no compiler."""
    where.mkdir(parents=True, exist_ok=True)
    for n in names:
        found = shutil.which(n, path="/usr/bin:/bin")
        assert found, n
        (where / n).symlink_to(found)
    return where


DSLS = ("flydsl", "triton")  # what the kernels stage must install itself (the FlyDSL venv's copies are hidden)
_DSL_INSTALL = re.compile(r"^(\S*/)?pip install((?:\s+[A-Za-z0-9_.-]+==[A-Za-z0-9_.+-]+)+)$")


def split_site(site: Path, where: Path) -> tuple[Path, Path]:
    """Two views of the FlyDSL venv's site-packages (folders of links): all but the DSLs, and the DSLs alone."""
    rest, dsls = where / "site-without-dsls", where / "dsls"
    rest.mkdir(parents=True)
    dsls.mkdir()
    for entry in site.iterdir():
        is_dsl = re.match(rf"^({'|'.join(DSLS)})([-_.].*)?$", entry.name, flags=re.I)
        (dsls if is_dsl else rest).joinpath(entry.name).symlink_to(entry)
    return rest, dsls


@dataclass
class Replay:
    tmp: Path
    context: Path  # the build context: a clean checkout plus the public key
    secret: Path  # the private key, given as a build secret
    outer: dict[str, list[str]]  # stage name -> the dev venvs' site folders its Python layers over
    cache: Path  # the build cache (docker's layer cache, in effect)
    dsls: tuple[Path, dict[str, str]]  # the DSLs' view and their installed versions, for the one stand-in
    roots: dict[str, Path] = field(default_factory=dict)

    def dsl_install(self, mapped: str) -> bool:
        """The one command replaced: ``pip install flydsl==V triton==V`` (no index here) puts the FlyDSL venv's own
        copies on the venv's path instead, once the pins are checked against them. Anything else runs as written."""
        m = _DSL_INSTALL.match(mapped)
        pins = dict(w.split("==") for w in m.group(2).split()) if m else {}
        if not pins or not set(pins) <= set(DSLS):
            return False
        view, installed = self.dsls
        assert pins == {k: installed[k] for k in pins}, f"the recipe pins {pins}, the FlyDSL venv holds {installed}"
        assert m.group(1), "the recipe installs the DSL into a venv named by its path"
        py = Path(m.group(1)) / "python"
        site = subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        with open(Path(site, "_outer.pth"), "a") as f:
            f.write(f"{view}\n")
        return True

    def path(self, stage: str, image_path: str) -> Path:
        return self.roots[stage] / image_path.lstrip("/")

    def run_stage(self, st: Stage) -> dict[str, str]:
        root = self.roots[st.name] = self.tmp / st.name
        image = root / "image"  # the base image's Python (python, pip, and what pip installs) and its tools
        make_python(image, self.outer[st.name])
        compilers = st.name != "stage2"  # the runtime has none; the kernels and extension stages may
        tools = tools_dir(root / "tools", ("sh", "rm", "cp", "ls", "env", "cat", "mkdir", "chmod"))
        shim = root / "shim"  # `python -m venv DIR` makes a venv layered like the image's, over the same dev venvs
        shim.mkdir()
        outer = " ".join(f"'{o}'" for o in self.outer[st.name])
        (shim / "python").write_text(f"""#!/bin/sh
if [ "$1 $2" = "-m venv" ]; then  # as make_python does
  "{sys.executable}" -m venv --without-pip "$3" || exit 1
  site=$("$3/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
  printf '%s\\n' {outer} > "$site/_outer.pth"
  printf '#!/bin/sh\\nexec "%s/bin/python" -m pip "$@"\\n' "$3" > "$3/bin/pip" && chmod 755 "$3/bin/pip"
  exit
fi
exec "{image}/bin/python" "$@"
""")
        (shim / "python").chmod(0o755)
        path = [str(shim), str(image / "bin"), str(tools)] + (["/usr/bin", "/bin"] if compilers else [])
        env = {"PATH": os.pathsep.join(path), "HOME": str(root / "home"), "PIP_NO_INDEX": "1",
               "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "LANG": "C.UTF-8",
               "FLYSHIP_CACHE_DIR": str(self.cache)}
        if compilers:  # the extension stage builds into the session's extension cache: built once per session
            for k in ("FLYSHIP_EXTENSIONS_DIR", "TORCH_EXTENSIONS_DIR"):
                if k in os.environ:
                    env[k] = os.environ[k]
            env.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
        else:
            env["CXX"] = env["CC"] = str(root / "no" / "c++")
        (root / "home").mkdir()
        secret = self.path(st.name, "/run/secrets/flyship_key")
        for instr, rest in st.steps:
            if instr == "ENV":
                for kv in rest.split():
                    k, _, v = kv.partition("=")
                    env[k] = _MAPPED_RE.sub(lambda m: str(root) + m.group(1), " " + v)[1:]
            elif instr == "COPY":
                self.copy(st.name, rest)
            else:
                mounts = re.findall(r"--mount=(\S+)\s+", rest)
                command = re.sub(r"--mount=\S+\s+", "", rest)
                if command.startswith("apt-get "):
                    continue  # system packages: the host has them (Makefile's apt target)
                for m in mounts:
                    assert m == "type=secret,id=flyship_key", m
                    secret.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(self.secret, secret)
                mapped = _MAPPED_RE.sub(lambda m: str(root) + m.group(1), " " + command)[1:]
                if self.dsl_install(mapped):
                    continue
                r = subprocess.run(["/bin/sh", "-c", mapped], cwd=root, env=env, capture_output=True, text=True,
                                   timeout=900)
                assert r.returncode == 0, (f"stage {st.name}: `RUN {command}` exited {r.returncode}\n"
                                           f"--- stdout\n{r.stdout[-4000:]}\n--- stderr\n{r.stderr[-4000:]}")
                if secret.exists():
                    secret.unlink()  # a secret mount lasts one RUN
        return env

    def copy(self, stage: str, rest: str) -> None:
        words = rest.split()
        src_stage = words[0][len("--from="):] if words[0].startswith("--from=") else None
        *srcs, dest = words[1:] if src_stage else words
        dst = self.path(stage, dest)
        for src in srcs:
            if src_stage is None and src == ".":
                copy_checkout(dst)
                shutil.copy2(self.context / "flyship.key.pub", dst / "flyship.key.pub")
                continue
            base = self.roots[src_stage] if src_stage else self.context
            found = sorted(glob.glob(str(base / src.lstrip("/"))))
            assert found, f"stage {stage}: `COPY {rest}` matches nothing"
            for f in found:
                if dest.endswith("/"):
                    dst.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dst / Path(f).name)
                else:
                    dst.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(f, dst)


def test_the_example_dockerfile_is_the_docs_recipe():
    blocks = fenced(DOC.read_text(), "dockerfile")
    assert len(blocks) == 1, "docs/shipping.md should hold exactly one Dockerfile, the recipe"
    assert blocks[0] == DOCKERFILE.read_text(), "examples/shipping/Dockerfile and docs/shipping.md's recipe differ"


def test_the_recipe_builds_signs_prebuilds_and_loads_with_no_compiler(tmp_path, example_bundle, example_cache, ext):
    flydsl_py = flydsl_python()
    if flydsl_py is None:
        pytest.skip("needs the FlyDSL build Python (.venv-flydsl): it would run the recipe's kernels stage")
    flydsl_site = subprocess.run([flydsl_py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 capture_output=True, text=True, check=True).stdout.strip()
    workload_site = sysconfig.get_paths()["purelib"]
    args, stages = parse(fenced(DOC.read_text(), "dockerfile")[0])
    assert [s.name for s in stages] == ["kernels", "extension", "stage2"]
    assert [s.base for s in stages[1:]] == ["${RUNTIME}", "${RUNTIME}"] and "RUNTIME" in args

    context = tmp_path / "context"
    context.mkdir()
    secret, pub = signing.generate_key(tmp_path / "flyship.key")
    shutil.copy2(pub, context / "flyship.key.pub")
    # The kernels stage: the FlyDSL venv's packages but its DSLs (the recipe installs those), then the workload venv's
    # for what the FlyDSL venv lacks (ninja).
    no_dsls, dsls = split_site(Path(flydsl_site), tmp_path / "views")
    versions = dict(subprocess.run([flydsl_py, "-c", "from importlib.metadata import version as v; "
                                    f"print(' '.join(d + '=' + v(d) for d in {DSLS!r}))"],
                                   capture_output=True, text=True, check=True).stdout.split()[i].split("=")
                    for i in range(len(DSLS)))
    outer = {"kernels": [str(no_dsls), workload_site], "extension": [workload_site], "stage2": [workload_site]}
    replay = Replay(tmp_path / "stages", context, secret, outer, example_cache, (dsls, versions))
    env = {}
    for st in stages:
        env = replay.run_stage(st)
    runtime = replay.roots["stage2"]
    assert not (runtime / "src").exists()  # the runtime stage removed its source copy
    assert not shutil.which("c++", path=env["PATH"]) and not shutil.which("g++", path=env["PATH"])

    workload = fenced(DOC.read_text(), "python")[-1]  # the recipe's workload snippet
    assert 'flyship.load("/opt/kernels/my_kernels.flyship")' in workload
    snippet = _MAPPED_RE.sub(lambda m: str(runtime) + m.group(1), " " + workload)[1:]
    r = subprocess.run([str(runtime / "image" / "bin" / "python"), "-c", snippet], cwd=runtime, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "building" not in r.stderr  # the prebuilt extension, found beside the pack
    # The signature is checked at load: trust another key and the same load is refused.
    _, other = signing.generate_key(tmp_path / "other.key")
    r = subprocess.run([str(runtime / "image" / "bin" / "python"), "-c", snippet], cwd=runtime,
                       env=dict(env, FLYSHIP_TRUSTED_KEYS=str(other)), capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "unknown key" in r.stderr, r.stderr
