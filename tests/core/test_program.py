"""Reading a .pte without loading it: a file that is not a whole program is refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefect_executorch.errors import InvalidProgram
from prefect_executorch.program import read_program


def test_a_file_that_is_not_a_program_is_refused(tmp_path: Path) -> None:
    (tmp_path / "junk.pte").write_bytes(b"\x00" * 64)
    with pytest.raises(InvalidProgram, match="no 'ET' file identifier"):
        read_program(tmp_path / "junk.pte")
    (tmp_path / "cut.pte").write_bytes(b"\x1c\x00\x00\x00ET12eh00" + (24).to_bytes(4, "little") + (4096).to_bytes(8, "little") + b"\x00" * 16)
    with pytest.raises(InvalidProgram, match="is truncated"):
        read_program(tmp_path / "cut.pte")
