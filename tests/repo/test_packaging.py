"""The distribution installs `prefect_executorch` with its subpackages and no top-level tasks/flows."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_wheel_maps_top_level_folders_into_the_package(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
    )
    (wheel,) = tmp_path.glob("prefect_executorch-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    for module in ("flows/build.py", "tasks/export.py", "artifacts/store.py", "targets/cpu.py", "cli/main.py"):
        assert f"prefect_executorch/{module}" in names
    # Every package of the source tree (a new stage folder must be listed in pyproject.toml too).
    source = ROOT / "src" / "prefect_executorch"
    packages = {f"prefect_executorch/{init.relative_to(source).as_posix()}" for init in source.rglob("__init__.py")}
    assert packages - set(names) == set()
    top_level = {name.split("/")[0] for name in names}
    assert top_level <= {"prefect_executorch", f"{wheel.name.split('-')[0]}-{wheel.name.split('-')[1]}.dist-info"}

    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
                   check=True)
    # Import from the installed wheel alone: the source tree is not on the path.
    code = (
        "import prefect_executorch.flows.build as b, prefect_executorch.artifacts.publishing as r; "
        "print(b.__file__); print(r.__file__)"
    )
    out = subprocess.run([sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(target)!r}); {code}"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    assert all(line.startswith(str(target)) for line in out.split())


def test_editable_install_imports_from_the_source_tree() -> None:
    out = subprocess.run(
        [sys.executable, "-c", "import prefect_executorch.flows.build as b; print(b.__file__)"],
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip()
    # The file itself, where tracebacks and every tool find it; the top-level folder links to it.
    assert Path(out) == ROOT / "src" / "prefect_executorch" / "flows" / "build.py"
    assert not Path(out).parent.is_symlink()
    assert (ROOT / "flows").is_symlink() and (ROOT / "flows" / "build.py").resolve() == Path(out)
