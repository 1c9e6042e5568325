"""What ``pip install soniq-django`` gets: the sdist's and the wheel's files and metadata.

Builds both from a copy of this checkout with setuptools' PEP 517 hooks
(``build_sdist``, then ``build_wheel`` from the unpacked sdist, as ``python
-m build`` does), offline: the venv's setuptools (a test extra) is the
backend, no build isolation. The sdist is the package, README, LICENSE,
pyproject.toml and docs/ (MANIFEST.in), without the test suite, which runs
from a clone; the wheel is the package alone, with its SQL, templates and
py.typed. Neither depends on a database; both passes run it.
"""

import email.parser
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

from tests.support.ci import unavailable

ROOT = Path(__file__).resolve().parents[1]

#: Never copied into the build tree: virtualenvs, VCS data, build output, caches.
IGNORED = shutil.ignore_patterns(
    ".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", "*.pyc", ".test-results",
    ".pytest_cache", ".hypothesis", "*.sqlite3")

#: Directories of the repository the sdist leaves out. The decision records
#: link to benchmark sources (bench/), which stay in the repository.
NOT_SHIPPED = ("tests", "bench", "example_project", "scripts", ".ci")

LINK = re.compile(r"\]\(([^)\s]+)\)")

BUILD = """
import sys
import tarfile
from pathlib import Path

import setuptools.build_meta as backend

source, out = Path(sys.argv[1]), Path(sys.argv[2])
import os
os.chdir(source)
sdist = out / backend.build_sdist(str(out))
with tarfile.open(sdist) as archive:
    archive.extractall(out / "unpacked", filter="data")
(unpacked,) = (out / "unpacked").iterdir()
os.chdir(unpacked)
wheel = out / backend.build_wheel(str(out))
print(sdist)
print(wheel)
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """(sdist, wheel) built from a copy of this checkout."""
    try:
        import setuptools
    except ImportError:
        unavailable("setuptools is not installed (a test extra)")
    if int(setuptools.__version__.split(".")[0]) < 77:
        unavailable(f"setuptools {setuptools.__version__} predates PEP 639 (the test extra "
                    "asks for >=77; run scripts/venv.sh)")
    base = tmp_path_factory.mktemp("packaging")
    source, out = base / "source", base / "out"
    shutil.copytree(ROOT, source, symlinks=True, ignore=IGNORED)
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(BUILD), str(source), str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sdist, wheel = (Path(line) for line in done.stdout.strip().splitlines()[-2:])
    return sdist, wheel


def _sdist_files(sdist: Path) -> set[str]:
    with tarfile.open(sdist) as archive:
        names = [member.name for member in archive.getmembers() if member.isfile()]
    return {name.split("/", 1)[1] for name in names}


def _wheel_files(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name for name in archive.namelist() if not name.endswith("/")}


def _package_files(pattern: str) -> set[str]:
    return {path.relative_to(ROOT).as_posix() for path in (ROOT / "soniq_django").glob(pattern)
            if "__pycache__" not in path.parts}


def _wheel_metadata(wheel: Path):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [name for name in archive.namelist() if name.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def test_the_sdist_carries_the_docs_and_the_license_and_no_tests(built):
    sdist, _ = built
    files = _sdist_files(sdist)
    docs = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs").rglob("*.md")}
    assert docs and docs <= files, sorted(docs - files)
    assert {"README.md", "LICENSE", "pyproject.toml", "PKG-INFO"} <= files
    assert _package_files("**/*.py") <= files
    shipped = sorted(name for name in files if name.split("/")[0] in NOT_SHIPPED)
    assert not shipped, shipped
    assert "manage.py" not in files and "Makefile" not in files


def test_the_readme_and_docs_links_resolve_inside_the_sdist(built, tmp_path):
    sdist, _ = built
    with tarfile.open(sdist) as archive:
        archive.extractall(tmp_path, filter="data")
    (top,) = tmp_path.iterdir()
    broken = []
    for page in [top / "README.md", *(top / "docs").rglob("*.md")]:
        for target in LINK.findall(page.read_text(encoding="utf-8")):
            path = target.partition("#")[0]
            if re.match(r"[a-z]+:", target) or not path:
                continue
            resolved = (page.parent / path).resolve()
            if resolved.is_relative_to(top) and resolved.relative_to(top).parts[0] == "bench":
                continue  # benchmark sources, in the repository only (NOT_SHIPPED)
            if not resolved.exists():
                broken.append(f"{page.relative_to(top)}: {target}")
    assert not broken, broken


def test_the_wheel_is_the_package_with_its_data_files(built):
    _, wheel = built
    files = _wheel_files(wheel)
    tops = {name.split("/")[0] for name in files}
    assert tops == {"soniq_django", "soniq_django-0.1.0.dev0.dist-info"}, tops
    assert "soniq_django/py.typed" in files
    wanted = _package_files("**/*.py") | _package_files("sql/*.sql") | _package_files(
        "templates/**/*.html")
    assert {name for name in wanted if name.endswith(".sql")}, "no SQL files found"
    assert {name for name in wanted if name.endswith(".html")}, "no templates found"
    assert wanted <= files, sorted(wanted - files)


def test_both_carry_the_mit_license_in_their_metadata(built):
    sdist, wheel = built
    assert "soniq_django-0.1.0.dev0.dist-info/licenses/LICENSE" in _wheel_files(wheel)
    with tarfile.open(sdist) as archive:
        (pkg_info,) = [m for m in archive.getmembers() if m.name.count("/") == 1
                       and m.name.endswith("/PKG-INFO")]
        sdist_metadata = email.parser.Parser().parsestr(archive.extractfile(pkg_info).read()
                                                        .decode())
    for metadata in (sdist_metadata, _wheel_metadata(wheel)):
        assert metadata["License-Expression"] == "MIT"
        assert metadata.get_all("License-File") == ["LICENSE"]
    assert "Copyright (c) 2026 the soniq_django developers" in (ROOT / "LICENSE").read_text()


def test_only_django_and_croniter_are_required_and_the_rest_are_extras(built):
    _, wheel = built
    metadata = _wheel_metadata(wheel)
    required, extras = [], {}
    for requirement in metadata.get_all("Requires-Dist"):
        spec, _, marker = requirement.partition(";")
        name = re.match(r"[A-Za-z0-9_.-]+", spec)[0].lower()
        match = re.search(r'extra == "([^"]+)"', marker)
        if match:
            extras.setdefault(match[1], []).append(name)
        else:
            required.append(name)
    assert sorted(required) == ["croniter", "django"]
    assert set(metadata.get_all("Provides-Extra")) == {
        "postgres", "tasks", "environ", "prometheus", "opentelemetry", "test"}
    assert (extras["postgres"], extras["tasks"], extras["environ"], extras["prometheus"],
            extras["opentelemetry"]) == (
        ["psycopg"], ["django-tasks"], ["django-environ"], ["prometheus_client"],
        ["opentelemetry-api"])
    # The test extra is the test tools; the suite's other needs are the extras above.
    assert not {"psycopg", "django-tasks", "django-environ"} & set(extras["test"])
