"""sok::parallel_for and its worker pool, checked in C++ against the installed headers.

The backends' bulk loops run on the pool's parked threads (sok/kit/parallel.hpp). The check program
(tests/cpp/parallel_for_check.cpp) covers what the Python tests cannot time or force: every part
running exactly once over many calls, parallel_for inside parallel_for, several threads calling at
once, and a worker's exception reaching the caller. Built with the system C++ compiler (skipped
without one).
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import sparse_operation_kit as sok

CHECK = Path(__file__).parent / "cpp" / "parallel_for_check.cpp"


@pytest.mark.parametrize("sanitizer", [None, "thread"])
def test_parallel_for_runs_each_part_once_nested_concurrent_and_rethrows(tmp_path, sanitizer):
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    binary = tmp_path / "parallel_for_check"
    flags = ["-std=c++17", "-O1", "-pthread", f"-I{sok.get_include()}"]
    if sanitizer is not None:
        flags += ["-g", f"-fsanitize={sanitizer}"]
    built = subprocess.run([compiler, *flags, str(CHECK), "-o", str(binary)], capture_output=True, text=True)
    if built.returncode != 0 and sanitizer is not None:
        pytest.skip(f"{compiler} cannot build with -fsanitize={sanitizer}: {built.stderr[-300:]}")
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stdout + run.stderr
    if sanitizer is not None:
        assert "WARNING: ThreadSanitizer" not in run.stderr, run.stderr
