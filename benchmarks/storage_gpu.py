#!/usr/bin/env python
"""GPU storage benchmark: det ("hbm") and hkv ("hybrid") on one CUDA device, measured with
HierarchicalKV's method (reference/hashtables.md §2.2, §2.7) and set against HKV's own benchmark
(with --hkv: run on the same GPU in the same run at our capacities; without: its §2.6 figures) and
against the bounds of §5.3/§5.4.

Method, per (configuration, table, load factor λ, operation), as HKV's ``merlin_hashtable_benchmark``:

* **state**: ``clear``, then fill with the continuous keys 0, 1, 2, ... in batches of 1 Mi
  (``insert_or_assign``, row value = key mod 65521, so results can be checked), then top up with
  more continuous keys until size / capacity is within 0.001 of λ (hkv evicts at λ = 1.0);
* **warm-up**: 9 calls of the operation with one key;
* **measured batch**: 1 Mi keys = the first 629,145 keys of the latest fill batch (HKV's host key
  buffer, so existing keys) + 419,431 new keys counting down from 2**64 - 1: 60% hits, 40% new;
* **host timing** (HKV's): ``time.perf_counter`` around one call (its argument views made
  beforehand) plus a device synchronize, best
  of 2 runs, each on its own clear + refill + warm-up (HKV clears only before its first run, so its
  second run of an inserting operation at λ < 1 finds the new keys already stored);
* **event timing**: CUDA events around each of ``--event-calls`` calls (default 20), the mean,
  each after a 1 ms GPU spin so that the host's launch cost stays out: ``find`` and
  ``export_batch`` repeat the measured batch on one state; each call of an inserting operation
  gets a clear + refill first, so every call sees the same 60/40 state;
* **operations**: find (the tables' ``find_hits``: as HKV's find, the rows of missing keys are not
  written), find_default (``find``: a missing key's row becomes zeros; no HKV figure),
  find_or_insert, insert_or_assign (with the unique-keys hint, ``SOK_HINT_UNIQUE_KEYS``: the
  batch's keys are distinct, and HKV's benchmark calls its insert_or_assign with ``unique_key``
  true), insert_or_assign_dedup (without the hint: the table deduplicates every key; no HKV
  figure), accum_or_assign, insert_and_evict, and export_batch over the slots HKV scans (1 Mi / λ x
  0.995 from slot 0; throughput = 1 Mi / time).

Configurations: pure device memory at dims 8, 32, 64, 128 (det and hkv), and hybrid at dim 64 (hkv
with ``max_hbm_for_vectors`` = half of the row bytes, the other half in pinned host memory). hkv:
``init_capacity = max_capacity`` = the capacity, buckets of 128, LRU. det never evicts: at each λ it
holds the same λ x capacity keys, in a table sized for them plus the new keys of one call.

HKV's baseline: with ``--hkv PATH``, HKV's own ``merlin_hashtable_benchmark`` runs beside ours:
``benchmarks/hkv_driver.cu`` compiles HKV's benchmark source into a program that calls its
``test_main`` for one configuration given on its command line, so each configuration runs in its
own process (just before our tables of it, with our GPU memory freed) at our capacity and λ values
(HKV takes the HBM for values in whole GiB: pure device memory gets the row bytes rounded up;
hybrid gets half the row bytes, at the smallest power-of-two capacity from ours up where that half
is whole GiB). PATH is a driver that ``benchmarks/build_hkv.sh`` built, or an HKV source tree or
git repository to build one from for this GPU (kept in ``.device-hkv/`` and reused). Without
``--hkv``, HKV's §2.6 figures (its benchmark on this project's H100, 2026-11-22, at 64-128 Mi slots)
stand in, labelled as constants of another run and capacity.

Results are G-KV/s in 2^30 (HKV's "Billion-KV/second") and 10^9 units; ``vs HKV`` is host
throughput over HKV's figure for the same configuration, λ and operation; ``of C`` and ``of A`` are
the 10^9 throughput over Model C (min) and Bound A of §5.4, computed from §5.3's traffic per key.
Then a pooled lookup (64 Ki bags x 20 keys, sum; dims 32 and 128): ``find`` into a buffer + a CuPy
sum against ``torch.nn.functional.embedding_bag`` over a weight of as many rows, timed in the same
run.

Needs CuPy, a GPU and CUDA builds of sok-backend-det / sok-backend-hkv (exit status 2 otherwise);
Torch for the pooled baseline; nvcc for ``--hkv`` with a source. Exit status 1 when an operation
fails or returns wrong results, or HKV's benchmark fails, times out (``--hkv-timeout``) or skips a
configuration.

Usage::

    python3 benchmarks/storage_gpu.py                    # everything: the full run
    python3 benchmarks/storage_gpu.py --quick            # 4 Mi slots, λ 0.5, dims 8 and 64: seconds
    python3 benchmarks/storage_gpu.py [--quick] --json out.json
    bash benchmarks/build_hkv.sh /path/to/HierarchicalKV  # prints .device-hkv/hkv_driver-sm90-<hash>
    python3 benchmarks/storage_gpu.py --hkv .device-hkv/hkv_driver-sm90-<hash>   # HKV in the same run
"""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
from machine import extension_builds, load_average

MI = 1 << 20
KEYS_PER_CALL = MI
#: HKV's create_keys_for_hitrate: int(1048576 * 0.6f) existing keys, the rest new.
N_HIT = 629_145
N_NEW = KEYS_PER_CALL - N_HIT
HIT_FRACTION = N_HIT / KEYS_PER_CALL
WARMUP_CALLS = 9
HOST_RUNS = 2
LOAD_EPSILON = 0.001
EXPORT_SAFE_RATIO = 0.995
#: Top-up batches at most (HKV has no limit; a table that stops filling must not hang the run).
MAX_TOPUPS = 1000
#: Row value of key k: k mod this prime, exact in float32, and so are sums of 20 of them.
VALUE_MODULUS = 65521
ACCUM_DELTA = 0.5
DEVICE = "cuda:0"

OPS = (
    "find",
    "find_default",
    "find_or_insert",
    "insert_or_assign",
    "insert_or_assign_dedup",
    "accum_or_assign",
    "insert_and_evict",
    "export_batch",
)
INSERTING_OPS = ("find_or_insert", "insert_or_assign", "insert_or_assign_dedup", "accum_or_assign", "insert_and_evict")
TABLES = {"det": "sok_backend_det", "hkv": "sok_backend_hkv"}
MODES = {"device": "pure device memory", "hybrid": "hybrid, half the rows in host memory"}

#: Slots per configuration: HKV used 128 Mi (dims 8, 32) and 64 Mi (dims 64, 128, hybrid 128 Mi);
#: these keep the full run within minutes while every table stays far beyond the 50 MB L2.
DEFAULT_CAPACITY_MI = {("device", 8): 64, ("device", 32): 64, ("device", 64): 32, ("device", 128): 32}
DEFAULT_HYBRID_CAPACITY_MI = 16
HYBRID_DIM = 64
QUICK_CAPACITY_MI = 4

POOLED_BAGS = 64 * 1024
POOLED_HOTNESS = 20
POOLED_DIMS = (32, 128)
POOLED_ROWS = 16 * MI
QUICK_POOLED_ROWS = 2 * MI
POOLED_WARMUP = 3
POOLED_HOST_RUNS = 3
#: The CUDA issue's reference for embedding_bag, G keys/s (not measured here).
ISSUE_TORCH_GKEYS = {32: 9.95, 128: 2.98}

# -- HKV's figures ------------------------------------------------------------------------------
#: The operations HKV's benchmark times that this script times too, in its API names (find against
#: our find_hits); HKV refuses insert_and_evict in hybrid mode and has no accum_or_assign benchmark.
HKV_APIS = ("insert_or_assign", "find", "find_or_insert", "insert_and_evict", "export_batch")
HKV_HYBRID_APIS = tuple(api for api in HKV_APIS if api != "insert_and_evict")
#: Without --hkv: HKV ae24eec's own merlin_hashtable_benchmark on this project's H100 80GB HBM3
#: (SXM5), 2026-11-22, reference/hashtables.md §2.6, in 2^30 KV/s, best of 2 single calls, LRU, at
#: the capacities of HKV_CONSTANT_CAPACITY (not this script's). Keys: (mode, dim) -> λ -> the
#: figures of HKV_APIS in that order (None: not run).
_HKV_CONSTANTS: dict[tuple[str, int], dict[float, tuple[float | None, ...]]] = {
    ("device", 8): {
        0.50: (1.808, 3.652, 1.870, 1.626, 6.240),
        0.75: (1.691, 3.567, 1.760, 1.613, 5.860),
        1.00: (1.240, 3.628, 1.073, 0.753, 5.905),
    },
    ("device", 32): {
        0.50: (1.727, 3.404, 1.752, 1.435, 1.045),
        0.75: (1.667, 3.400, 1.678, 1.391, 0.697),
        1.00: (1.189, 3.445, 1.204, 0.768, 0.697),
    },
    ("device", 64): {
        0.50: (1.493, 2.928, 1.512, 1.257, 0.513),
        0.75: (1.452, 2.870, 1.403, 1.167, 0.286),
        1.00: (1.118, 3.016, 1.133, 0.710, 0.255),
    },
    ("device", 128): {
        0.50: (1.106, 2.076, 1.118, 0.939, 0.253),
        0.75: (1.097, 2.111, 1.093, 0.951, 0.127),
        1.00: (0.948, 2.179, 0.930, 0.612, 0.105),
    },
    ("hybrid", 64): {
        0.50: (0.151, 0.189, 0.149, None, 0.516),
        0.75: (0.150, 0.190, 0.150, None, 0.302),
        1.00: (0.144, 0.188, 0.143, None, 0.250),
    },
}
#: The capacity (slots) of each configuration of _HKV_CONSTANTS; hybrid: 16 GB of rows in HBM, 16 GB on the host.
HKV_CONSTANT_CAPACITY = {
    ("device", 8): 128 * MI,
    ("device", 32): 128 * MI,
    ("device", 64): 64 * MI,
    ("device", 128): 64 * MI,
    ("hybrid", 64): 128 * MI,
}
HKV_CONSTANTS_LABEL = "HKV's constant figures from 2026-11-22 (reference/hashtables.md §2.6, an H100 SXM), not this run"
#: Seconds one configuration of HKV's benchmark may take (--hkv-timeout).
HKV_TIMEOUT_S = 600
BUILD_HKV = Path(__file__).with_name("build_hkv.sh")
#: test_main's line when less device memory is free than the HBM asked for values.
HKV_SKIPPED = "free HBM is not enough"


class HkvError(Exception):
    """HKV's benchmark did not give its figures: it failed, timed out, skipped or printed something else."""


@dataclass(frozen=True)
class HkvPlan:
    """One configuration of HKV's benchmark as hkv_driver.cu takes it: HKV's ``test_main`` with
    ``init_capacity = max_capacity = capacity`` and ``max_hbm_for_vectors`` = ``hbm_gb`` GiB.

    Example::

        >>> plan = hkv_plan(Config("hybrid", 64, 16 * MI), [0.5])
        >>> plan.capacity // MI, plan.hbm_gb, plan.apis
        (16, 2, ('insert_or_assign', 'find', 'find_or_insert', 'export_batch'))
    """

    mode: str
    dim: int
    capacity: int
    hbm_gb: int
    lambdas: tuple[float, ...]
    apis: tuple[str, ...]

    def command(self, binary: str | os.PathLike[str]) -> list[str]:
        """The driver's command line for this configuration."""
        return [
            os.fspath(binary),
            *("--dim", str(self.dim), "--capacity", str(self.capacity), "--hbm-gb", str(self.hbm_gb)),
            *("--keys-per-op", str(KEYS_PER_CALL), "--lambdas", ",".join(str(lam) for lam in self.lambdas)),
            *("--apis", ",".join(self.apis)),
        ]


def hkv_plan(cfg: Config, lambdas: Sequence[float]) -> HkvPlan:
    """HKV's run for a configuration of ours. HKV's ``test_main`` takes the HBM for values in whole
    GiB: pure device memory gets the row bytes rounded up (every row in HBM; HKV allocates only
    what the rows need); hybrid gets half the row bytes, at our capacity when that half is a whole
    number of GiB, else at the smallest larger power of two where it is (say --quick's 4 Mi slots
    of dim 64: 8 Mi, 1 GiB in HBM and 1 GiB in host memory)."""
    row_bytes = cfg.dim * 4
    if cfg.mode == "device":
        hbm_gb = -(-cfg.capacity * row_bytes // 2**30)
        return HkvPlan(cfg.mode, cfg.dim, cfg.capacity, hbm_gb, tuple(lambdas), HKV_APIS)
    capacity = cfg.capacity
    while capacity * row_bytes // 2 % 2**30:  # ends: capacities are powers of two
        capacity *= 2
    return HkvPlan(cfg.mode, cfg.dim, capacity, capacity * row_bytes // 2 // 2**30, tuple(lambdas), HKV_HYBRID_APIS)


def parse_hkv_output(text: str, plan: HkvPlan) -> tuple[dict[float, dict[str, float]], str]:
    """HKV's figures (2^30 KV/s by λ and API) and its source line from hkv_driver's stdout.

    The driver prints "# " lines (``# HKV: <source>`` among them), a header naming the APIs, then
    HKV's ``test_main`` rows, one per λ, as in ``| 0.50 |           1.808 |  3.652 |`` (λ with 2
    decimals, each figure ``%6.3f`` after blanks). Raises HkvError when the configuration was
    skipped or the text is not one row per λ of ``plan`` with a figure per API.

    Example::

        >>> plan = HkvPlan("device", 8, 4 * MI, 1, (0.5,), ("find", "export_batch"))
        >>> parse_hkv_output("# HKV: x\\n| λ | find | export_batch |\\n| 0.50 | 3.652 |  6.240 |", plan)
        ({0.5: {'find': 3.652, 'export_batch': 6.24}}, 'x')
    """
    lines = text.splitlines()
    if any(HKV_SKIPPED in line for line in lines):
        raise HkvError(
            f"HKV's benchmark skipped the configuration: less than {plan.hbm_gb} GiB of device memory was "
            "free (its test_main's check); free the GPU of other processes and run again"
        )
    source = next((line.removeprefix("# HKV:").strip() for line in lines if line.startswith("# HKV:")), "")
    header = next((i for i, line in enumerate(lines) if line.startswith("| λ |")), None)
    if header is None:
        raise HkvError(f"no header line '| λ | ...' in HKV's output: {tail(text)!r}")
    columns = [cell.strip() for cell in lines[header].strip().strip("|").split("|")]
    if columns != ["λ", *plan.apis]:
        raise HkvError(f"HKV's header names {columns[1:]}, expected {list(plan.apis)}")
    rows = [line for line in lines[header + 1 :] if line.startswith("|") and not line.startswith("|-")]
    if len(rows) != len(plan.lambdas):
        raise HkvError(f"HKV printed {len(rows)} rows for {len(plan.lambdas)} λ values: {tail(text)!r}")
    figures: dict[float, dict[str, float]] = {}
    for lam, line in zip(plan.lambdas, rows):
        cells = [cell.strip() for cell in line.strip().removeprefix("|").split("|")]
        if cells[-1] == "":  # a complete row ends with "|"
            cells.pop()
        else:
            raise HkvError(f"HKV's row for λ {lam:.2f} is cut short: {line!r}")
        if cells[0] != f"{lam:.2f}" or len(cells) != 1 + len(plan.apis):
            raise HkvError(f"HKV's row {line!r} is not λ {lam:.2f} with {len(plan.apis)} figures")
        try:
            figures[lam] = {api: float(cell) for api, cell in zip(plan.apis, cells[1:])}
        except ValueError as error:
            raise HkvError(f"HKV's row {line!r} holds a figure that is not a number ({error})") from error
    return figures, source


def tail(text: str, lines: int = 12) -> str:
    """The last ``lines`` lines of ``text``, for error messages."""
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class HkvBaseline:
    """HKV's figures for one configuration of ours, 2^30 KV/s by λ and operation, and their source:
    ``"run"`` (HKV's benchmark in this run, ``command``) or ``"constants"`` (_HKV_CONSTANTS)."""

    source: str
    capacity: int | None
    hbm_gb: int | None = None
    figures: dict[float, dict[str, float]] = field(default_factory=dict)
    command: str = ""
    hkv: str = ""  # the driver's "# HKV:" line: which HierarchicalKV was built
    seconds: float | None = None
    output: str = ""
    error: str = ""

    def figure(self, lam: float, op: str) -> float | None:
        return self.figures.get(lam, {}).get(op)

    def column(self) -> str:
        return "HKV run" if self.source == "run" else "HKV const"

    def describe(self, capacity: int) -> str:
        """One line saying where the figures come from, for a configuration of ``capacity`` slots."""
        if self.source == "constants":
            if self.capacity is None:
                return "HKV: no constant figures at this configuration (run with --hkv PATH for some)"
            return f"HKV: {HKV_CONSTANTS_LABEL}, {self.capacity // MI} Mi slots"
        what = f"HKV: its own benchmark in this run ({self.hkv or 'source not printed'}), "
        what += f"{self.capacity // MI} Mi slots, {self.hbm_gb} GiB of HBM for values"
        if self.capacity != capacity:
            what += f" (not our {capacity // MI} Mi: HKV's benchmark takes its HBM for values in whole GiB)"
        if self.error:
            return f"{what}: FAILED: {self.error}"
        return f"{what}, {self.seconds:.0f} s"


def constant_baseline(mode: str, dim: int) -> HkvBaseline:
    """HKV's §2.6 figures for a configuration, or none where HKV was not run at that dim."""
    by_lambda = _HKV_CONSTANTS.get((mode, dim), {})
    figures = {
        lam: {api: value for api, value in zip(HKV_APIS, values) if value is not None}
        for lam, values in by_lambda.items()
    }
    return HkvBaseline("constants", HKV_CONSTANT_CAPACITY.get((mode, dim)), figures=figures)


def run_hkv(binary: str | os.PathLike[str], plan: HkvPlan, timeout: float) -> HkvBaseline:
    """One configuration of HKV's benchmark in a subprocess on this GPU. Failures (it cannot start,
    exits non-zero, times out, skips, prints no figures) are in the result's ``error``, with the
    command and the tail of what it printed."""
    command = plan.command(binary)
    baseline = HkvBaseline("run", plan.capacity, plan.hbm_gb, command=shlex.join(command))
    started = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired as error:
        baseline.output = as_text(error.stdout)
        baseline.error = (
            f"`{baseline.command}` ran past --hkv-timeout {timeout:g} s and was stopped; its output so far: "
            f"{tail(baseline.output)!r}; stderr: {tail(as_text(error.stderr))!r}. Give it longer with --hkv-timeout"
        )
        return baseline
    except OSError as error:
        baseline.error = f"`{baseline.command}` could not start ({error}); give a driver built by {BUILD_HKV.name}"
        return baseline
    baseline.seconds = time.perf_counter() - started
    baseline.output = done.stdout
    if done.returncode != 0:
        baseline.error = (
            f"`{baseline.command}` exited with status {done.returncode}; stderr: {tail(done.stderr)!r}; "
            f"stdout: {tail(done.stdout, 4)!r}"
        )
        return baseline
    try:
        baseline.figures, baseline.hkv = parse_hkv_output(done.stdout, plan)
    except HkvError as error:
        baseline.error = f"`{baseline.command}`: {error}"
    return baseline


def as_text(output: str | bytes | None) -> str:
    """A subprocess's captured output as text (TimeoutExpired may hold bytes)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def hkv_binary(path: str, arch: str) -> Path:
    """The driver for --hkv PATH (which exists): PATH itself when it is a file (a binary built by
    build_hkv.sh), else built by build_hkv.sh from the HKV source tree or git repository at PATH for
    this GPU's ``arch`` (reused when it was built before). Exit status 2 when neither works."""
    given = Path(path)
    if given.is_file():
        if not os.access(given, os.X_OK):
            fail(f"--hkv {path!r} is a file but not executable; give a driver built by {BUILD_HKV} or an HKV source")
        return given
    command = ["bash", os.fspath(BUILD_HKV), path, "--arch", arch]
    print(f"building HKV's benchmark: {shlex.join(command)}", flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, text=True)  # its progress and nvcc's on stderr
    if done.returncode != 0 or not done.stdout.strip():
        fail(f"`{shlex.join(command)}` exited with status {done.returncode} (its messages above)")
    return Path(done.stdout.strip().splitlines()[-1])


# -- bounds: reference/hashtables.md §5.1-§5.4 --------------------------------------------------
NOMINAL_BYTES_PER_S = 3.352e12  # §5.1: 5120-bit bus at 2619 MHz DDR (Bound A)
STREAM_BYTES_PER_S = 3.03e12  # §5.1, §5.4: coalesced traffic (Model C)
#: §5.4, Model C: random DRAM accesses per second by access size in bytes (reads up to 64 B at the 64 B rate).
RANDOM_READS_PER_S = {64: 31.5e9, 128: 21.3e9, 256: 10.95e9, 512: 5.52e9}
#: Full-sector random writes. 256 B was not measured (§5.2); the 512 B rate is bandwidth-bound, so
#: 256 B is taken at twice it, which reproduces §5.4's C:min upsert figure at dim 64.
RANDOM_WRITES_PER_S = {32: 25.7e9, 128: 20.9e9, 256: 2 * 5.93e9, 512: 5.93e9}

Access = tuple[str, int]  # ("stream" | "read" | "write", bytes)


def key_paths(op: str, dim: int) -> tuple[tuple[Access, ...], tuple[Access, ...]]:
    """Minimal DRAM traffic of one key (§5.3, a key probe plus a separate value, v = 4 dim bytes):
    the path of a hit and of a new (missing) key. find and insert_or_assign are §5.3's; the others
    follow the same rules (insert_and_evict: no eviction output counted, so still an upper bound)."""
    v = 4 * dim
    find_hit = (("stream", 9 + v), ("read", 32), ("read", v))  # key in, found + value out; key sector; value
    upsert = (("stream", 8 + v), ("read", 32), ("write", 32), ("write", v))  # key + value in; key sector r/w; value
    paths = {
        "find": (find_hit, (("stream", 9), ("read", 32))),
        "find_default": (find_hit, (("stream", 9 + v), ("read", 32))),  # a miss writes its zero row
        "insert_or_assign": (upsert, upsert),
        "insert_or_assign_dedup": (upsert, upsert),
        "insert_and_evict": (upsert, upsert),
        "find_or_insert": (find_hit, (("stream", 9 + v), ("read", 32), ("write", 32), ("write", v))),
        "accum_or_assign": ((*upsert, ("read", v)), upsert),
    }
    return paths[op]


def access_seconds(access: Access) -> float | None:
    """Model C's cost of one access, None where §5.2 has no figure for its size."""
    kind, size = access
    if kind == "stream":
        return size / STREAM_BYTES_PER_S
    rates = RANDOM_READS_PER_S if kind == "read" else RANDOM_WRITES_PER_S
    rate = rates.get(max(size, 64) if kind == "read" else size)
    return None if rate is None else 1.0 / rate


def key_bounds(op: str, dim: int) -> tuple[float | None, float]:
    """(Model C min, Bound A) in 10^9 keys/s for the 60/40 batch: time-weighted hit and miss paths."""
    hit, miss = key_paths(op, dim)
    a = sum(HIT_FRACTION * size for _, size in hit) + sum((1 - HIT_FRACTION) * size for _, size in miss)
    costs = [access_seconds(x) for x in hit], [access_seconds(x) for x in miss]
    if any(c is None for path in costs for c in path):
        return None, NOMINAL_BYTES_PER_S / a / 1e9
    c = HIT_FRACTION * sum(costs[0]) + (1 - HIT_FRACTION) * sum(costs[1])
    return 1.0 / c / 1e9, NOMINAL_BYTES_PER_S / a / 1e9


def export_bounds(dim: int, slots: int, exported: int) -> tuple[float, float]:
    """(Model C, Bound A) for export_batch, derived here (§5.4 has none): all traffic streams, an
    8-byte key read per scanned slot and, per exported row, its value read plus key and value
    written; throughput counted as HKV does, 1 Mi / time."""
    traffic = 8 * slots + exported * (8 + 8 * dim)
    return KEYS_PER_CALL * STREAM_BYTES_PER_S / traffic / 1e9, KEYS_PER_CALL * NOMINAL_BYTES_PER_S / traffic / 1e9


# -- environment --------------------------------------------------------------------------------
def fail(message: str) -> NoReturn:
    """Stop with exit status 2: the benchmark cannot run on this machine."""
    print(f"storage_gpu: {message}", file=sys.stderr)
    raise SystemExit(2)


def load_gpu_stack(tables: Sequence[str]) -> tuple[Any, dict[str, Any]]:
    """CuPy and the ``_core`` module of each asked-for backend, after checking that a GPU and
    CUDA builds are there (exit status 2 with what is missing otherwise)."""
    try:
        import cupy
    except ImportError as error:
        fail(f"needs CuPy and a CUDA GPU ({error}); install a CuPy matching your CUDA, e.g. pip install cupy-cuda13x")
    try:
        devices = cupy.cuda.runtime.getDeviceCount()
    except Exception as error:  # CUDARuntimeError, or a CuPy that cannot load its CUDA libraries
        fail(f"CuPy finds no usable CUDA device: {type(error).__name__}: {error}")
    if devices < 1:
        fail("CuPy finds no CUDA device")
    backends = {}
    for name in tables:
        package = TABLES[name]
        try:
            core = importlib.import_module(f"{package}._core")
        except ImportError as error:
            fail(f"{package} is not installed ({error}); run ci/setup.sh on this machine")
        build = getattr(core, "BUILD_INFO", {})
        if not build.get("cuda"):
            fail(
                f"{package} {build.get('version', '?')} was built without CUDA; rebuild it where nvcc is on PATH "
                f"(pip install ./packages/{package.replace('_', '-')}) or leave it out with --tables"
            )
        from sparse_operation_kit import _table

        if not _table.WITH_CUDA or _table.cuda_device_count() < 1:
            fail(f"{package} is a CUDA build but sok-core's binding (sparse_operation_kit._table) sees no CUDA device")
        backends[name] = core
    return cupy, backends


def import_torch() -> tuple[Any, str]:
    """Torch when it is importable and sees a GPU, else None and why not."""
    try:
        import torch
    except ImportError as error:
        return None, f"torch not importable ({error})"
    if not torch.cuda.is_available():
        return None, f"torch {torch.__version__} sees no CUDA device"
    return torch, ""


def cuda_version(number: int) -> str:
    return f"{number // 1000}.{number % 1000 // 10}"


def machine_info(cp: Any, backends: dict[str, Any], torch: Any, torch_note: str) -> dict[str, Any]:
    props = cp.cuda.runtime.getDeviceProperties(0)
    name = props["name"]
    _, total = cp.cuda.runtime.memGetInfo()
    return {
        "gpu": name.decode() if isinstance(name, bytes) else str(name),
        "gpu_memory_gib": round(total / 2**30, 1),
        "sm_count": props.get("multiProcessorCount", "?"),
        "cuda_runtime": cuda_version(cp.cuda.runtime.runtimeGetVersion()),
        "cuda_driver": cuda_version(cp.cuda.runtime.driverGetVersion()),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "numpy": np.__version__,
        "cupy": cp.__version__,
        "torch": torch.__version__ if torch is not None else torch_note,
        "backends": {name: dict(core.BUILD_INFO) for name, core in backends.items()},
        "extensions": extension_builds(),
        "load_average_start": load_average(),
    }


class Progress:
    """A tqdm bar on stderr when tqdm is importable, silent otherwise; ``write`` prints above it."""

    def __init__(self, total: int) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=total, desc="storage_gpu", unit="step", file=sys.stderr, leave=False)

    def step(self, what: str) -> None:
        if self._bar is not None:
            self._bar.set_postfix_str(what, refresh=False)
            self._bar.update(1)

    def write(self, text: str) -> None:
        if self._bar is None:
            print(text, flush=True)
        else:
            self._bar.write(text, file=sys.stdout)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- timing -------------------------------------------------------------------------------------
def host_seconds(cp: Any, call: Callable[[], Any]) -> tuple[float, Any]:
    """HKV's timer: wall time of one call plus a device synchronize (all work runs on stream 0)."""
    cp.cuda.runtime.deviceSynchronize()
    start = time.perf_counter()
    out = call()
    cp.cuda.runtime.deviceSynchronize()
    return time.perf_counter() - start, out


SPIN_NS = 1_000_000
_SPIN_SOURCE = r"""
extern "C" __global__ void storage_gpu_spin(unsigned long long ns) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now - start < ns);
}
"""


@functools.cache
def spin_kernel(cp: Any) -> Any:
    """A one-thread kernel that spins for its argument's nanoseconds, compiled and loaded once."""
    kernel = cp.RawKernel(_SPIN_SOURCE, "storage_gpu_spin")
    kernel((1,), (1,), (np.uint64(0),))
    cp.cuda.runtime.deviceSynchronize()
    return kernel


def event_seconds(cp: Any, calls: int, prepare: Callable[[], Any], call: Callable[[Any], Any]) -> list[float]:
    """Device time of each of ``calls`` calls between two CUDA events; ``prepare`` (untimed, in
    stream order before the start event) returns the argument of the call. A 1 ms one-thread spin
    kernel before each start event keeps the GPU busy while the host launches the call, so the
    launch cost stays out of the event time (a call that synchronizes with the host inside still
    shows its wait)."""
    spin = spin_kernel(cp)
    pairs = []
    for _ in range(calls):
        argument = prepare()
        start, end = cp.cuda.Event(), cp.cuda.Event()
        spin((1,), (1,), (np.uint64(SPIN_NS),))
        start.record()
        call(argument)
        end.record()
        pairs.append((start, end))
    pairs[-1][1].synchronize()
    return [cp.cuda.get_elapsed_time(start, end) / 1e3 for start, end in pairs]


# -- tables -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    """One configuration: where the rows live, their width, and the slots of the hkv table."""

    mode: str  # "device" or "hybrid"
    dim: int
    capacity: int

    def title(self) -> str:
        return f"{MODES[self.mode]}, dim {self.dim}: capacity {self.capacity // MI} Mi slots"


def table_options(kind: str, mode: str, dim: int, capacity: int) -> dict[str, str]:
    """Backend options: hkv as HKV's benchmark (init = max capacity, buckets of 128, LRU); det sized
    to hold ``capacity`` keys plus one call's new keys without growing."""
    if kind == "det":
        return {"init_capacity": str(capacity + N_NEW)}
    row_bytes = capacity * dim * 4
    # Pure: at least every row's bytes whether the backend reads GB as 10^9 or 2^30. Hybrid: half
    # of them, in HKV's GB (2^30).
    hbm_gb = row_bytes / 1e9 if mode == "device" else row_bytes / 2 / 2**30
    return {
        "init_capacity": str(capacity),
        "max_capacity": str(capacity),
        "max_bucket_size": "128",
        "max_hbm_for_vectors": f"{hbm_gb:.6g}",
        "evict_strategy": "lru",
    }


def free_device_memory(cp: Any) -> None:
    gc.collect()
    cp.get_default_memory_pool().free_all_blocks()
    cp.get_default_pinned_memory_pool().free_all_blocks()


class WrongResult(Exception):
    """A table returned results that contradict what was stored: its timings mean nothing."""


@dataclass
class FillState:
    """The table after a fill: ``target`` keys were asked for, ``size`` are stored."""

    target: int
    size: int
    load: float  # size / the load base (hkv: its capacity; det: the configuration's capacity)
    topups: int


class TableBench:
    """One table under test with HKV's key generator around it: fill and top-up to λ, the measured
    60/40 batch, one call of each operation, and the checks of their results."""

    def __init__(self, cp: Any, kind: str, table: Any, dim: int, load_base: int) -> None:
        self.cp, self.kind, self.table, self.dim = cp, kind, table, dim
        self.load_base = load_base
        n = KEYS_PER_CALL
        self.arange = cp.arange(n, dtype=cp.uint64)
        self.last = cp.zeros(n, dtype=cp.uint64)  # HKV's host key buffer: the latest fill batch over older ones
        self.fill_values = cp.empty((n, dim), dtype=cp.float32)
        self.new_keys = cp.asarray(np.uint64(2**64 - 1) - np.arange(N_NEW, dtype=np.uint64))
        self.values = cp.full((n, dim), ACCUM_DELTA, dtype=cp.float32)  # what the inserting ops write
        self.out_values = cp.empty((n, dim), dtype=cp.float32)
        self.found = cp.empty(n, dtype=cp.bool_)
        from sparse_operation_kit import _table

        self.unique_keys = _table.HINT_UNIQUE_KEYS  # the measured batch's keys are distinct
        self.ev_keys = cp.empty(n, dtype=cp.uint64)
        self.ev_values = cp.empty((n, dim), dtype=cp.float32)
        self.ev_scores = cp.empty(n, dtype=cp.uint64)
        self.export_keys = cp.empty(0, dtype=cp.uint64)
        self.export_values = cp.empty((0, dim), dtype=cp.float32)
        # Views of the buffers per call size, made once: slicing a CuPy array costs a few
        # microseconds, which HKV's timed calls (raw pointers) do not pay.
        self._views: dict[tuple[str, int], tuple[Any, ...]] = {}
        self.next_key = 0
        self.calls: dict[str, Callable[[Any, int], int | None]] = {
            "find": self._find,
            "find_default": self._find_default,
            "find_or_insert": self._find_or_insert,
            "insert_or_assign": self._insert_or_assign,
            "insert_or_assign_dedup": self._insert_or_assign_dedup,
            "accum_or_assign": self._accum_or_assign,
            "insert_and_evict": self._insert_and_evict,
            "export_batch": self._export_batch,
        }

    # state
    def insert_range(self, start: int, count: int) -> None:
        """insert_or_assign of keys start .. start + count - 1 (count <= 1 Mi), value key mod 65521."""
        keys = self.arange[:count] + np.uint64(start)
        self.fill_values[:count] = row_values(self.cp, keys)[:, None]
        self.table.insert_or_assign(keys, 0, self.dim, self.fill_values[:count], None, [])
        self.last[:count] = keys

    def fill(self, lam: float) -> FillState:
        """HKV's step 1 and 2: clear, continuous keys to λ x capacity, top-ups to within 0.001."""
        self.table.clear()
        target = int(self.load_base * lam)
        start = 0
        while start < target:
            count = min(KEYS_PER_CALL, target - start)
            self.insert_range(start, count)
            start += count
        size = self.table.size()
        topups = 0
        while (target - size) / self.load_base > LOAD_EPSILON and topups < MAX_TOPUPS:
            count = min(KEYS_PER_CALL, target - size)
            self.insert_range(start, count)
            start += count
            topups += 1
            size = self.table.size()
        self.next_key = start
        return FillState(target=target, size=size, load=size / self.load_base, topups=topups)

    def batch(self) -> Any:
        """The measured keys: 629,145 from the latest fill batch, then 419,431 never inserted."""
        return self.cp.concatenate([self.last[:N_HIT], self.new_keys])

    def export_slots(self, lam: float, size: int) -> int:
        """The slots export_batch scans: HKV's 1 Mi / λ x 0.995 for hkv; for det, the slots that
        hold as many rows at its own load factor (det's capacity has headroom)."""
        if self.kind == "hkv":
            return int(KEYS_PER_CALL / (int(self.load_base * lam) / self.load_base) * EXPORT_SAFE_RATIO)
        capacity = self.table.capacity()
        return min(capacity, int(KEYS_PER_CALL * EXPORT_SAFE_RATIO * capacity / max(size, 1)))

    def slots_for(self, op: str, lam: float, state: FillState) -> int:
        """The slots argument of ``run(op, ...)`` on ``state``: for export_batch the slots it scans
        (export_slots), with its output buffers reserved; 0 for every other operation."""
        if op != "export_batch":
            return 0
        slots = self.export_slots(lam, state.size)
        self.reserve_export(slots)
        return slots

    def reserve_export(self, slots: int) -> None:
        if self.export_keys.shape[0] < slots:
            self._views = {k: v for k, v in self._views.items() if k[0] != "export"}
            self.export_keys = self.export_values = None  # freed before the larger ones are allocated
            self.export_keys = self.cp.empty(slots, dtype=self.cp.uint64)
            self.export_values = self.cp.empty((slots, self.dim), dtype=self.cp.float32)

    # one call of each operation: keys (n,), or for export_batch the slots to scan
    def run(self, op: str, keys: Any, slots: int) -> int | None:
        return self.calls[op](keys, slots)

    def warmup(self, op: str) -> None:
        for _ in range(WARMUP_CALLS):
            self.run(op, self.last[:1], 1)

    def _sliced(self, what: str, n: int) -> tuple[Any, ...]:
        views = self._views.get((what, n))
        if views is None:
            if what == "export":
                views = (self.export_keys[:n], self.export_values[:n])
            else:
                views = (self.out_values[:n], self.found[:n], self.values[:n])
                views += (self.ev_keys[:n], self.ev_values[:n], self.ev_scores[:n])
            self._views[(what, n)] = views
        return views

    def _find(self, keys: Any, slots: int) -> None:
        out, found, *_ = self._sliced("keys", keys.shape[0])
        self.table.find_hits(keys, 0, self.dim, out, found)

    def _find_default(self, keys: Any, slots: int) -> None:
        out, found, *_ = self._sliced("keys", keys.shape[0])
        self.table.find(keys, 0, self.dim, out, None, found)

    def _find_or_insert(self, keys: Any, slots: int) -> None:
        out, found, *_ = self._sliced("keys", keys.shape[0])
        self.table.find_or_insert(keys, 0, self.dim, out, found, None, [])

    def _insert_or_assign(self, keys: Any, slots: int) -> None:
        values = self._sliced("keys", keys.shape[0])[2]
        self.table.insert_or_assign_hinted(keys, 0, self.dim, values, None, [], self.unique_keys)

    def _insert_or_assign_dedup(self, keys: Any, slots: int) -> None:
        values = self._sliced("keys", keys.shape[0])[2]
        self.table.insert_or_assign(keys, 0, self.dim, values, None, [])

    def _accum_or_assign(self, keys: Any, slots: int) -> None:
        values = self._sliced("keys", keys.shape[0])[2]
        self.table.accum_or_assign(keys, 0, self.dim, values, None, [])

    def _insert_and_evict(self, keys: Any, slots: int) -> int:
        _, _, values, ev_keys, ev_values, ev_scores = self._sliced("keys", keys.shape[0])
        return self.table.insert_and_evict(keys, 0, self.dim, values, None, [], ev_keys, ev_values, ev_scores)

    def _export_batch(self, keys: Any, slots: int) -> int:
        export_keys, export_values = self._sliced("export", slots)
        return self.table.export_batch(0, slots, 0, self.dim, export_keys, export_values, None, None)

    # checks, after the first timed call of each (λ, operation); outside every timed region
    def check(self, op: str, exact: bool, keys: Any, result: int | None, state: FillState, slots: int) -> str:
        """Raise WrongResult when the call's results contradict the table's contents; return a note.
        ``exact``: no key can have been evicted (det, or hkv at λ <= 0.5), so every count is known."""
        cp = self.cp
        if exact and state.size != state.target:
            raise WrongResult(f"the fill stored {state.size} of {state.target} keys")
        if op == "export_batch":
            count = int(result or 0)
            exported = self.export_keys[:count]
            if not 0 < count <= slots or bool(cp.any(exported >= np.uint64(self.next_key))):
                raise WrongResult(f"exported {count} rows from {slots} slots, or keys that were never stored")
            if not bool(cp.all(self.export_values[:count] == row_values(cp, exported)[:, None])):
                raise WrongResult("exported rows differ from the stored values")
            return f"exported {count} from {slots} slots"
        size_after = self.table.size()
        if op in ("find", "find_default", "find_or_insert"):
            expected_new = N_NEW if op == "find_or_insert" else 0
            if exact and size_after - state.size != expected_new:
                raise WrongResult(f"size {state.size} -> {size_after} for {expected_new} new keys")
            return self._check_found(op, exact, keys)
        if op == "insert_and_evict":
            # Each absent key adds a row or is refused, each eviction removes one, both counted in
            # `evicted`: growth + evicted = the absent keys, N_NEW plus any "hit" evicted by a top-up.
            evicted = int(result or 0)
            absent = size_after - state.size + evicted
            if (exact and (absent != N_NEW or evicted)) or not N_NEW <= absent <= KEYS_PER_CALL:
                raise WrongResult(f"size {state.size} -> {size_after} with {evicted} evicted for {N_NEW} new keys")
            return f"evicted {evicted}"
        if exact:
            if size_after - state.size != N_NEW:
                raise WrongResult(f"size {state.size} -> {size_after} for {N_NEW} new keys")
            expected = cp.full(keys.shape[0], ACCUM_DELTA, dtype=cp.float32)
            if op == "accum_or_assign":  # old value + delta; the warm-up key got WARMUP_CALLS deltas more
                expected[:N_HIT] += row_values(cp, keys[:N_HIT])
                expected[0] += WARMUP_CALLS * ACCUM_DELTA
            self._find(keys, 0)
            rows = self.out_values[: keys.shape[0]]
            if not bool(self.found[: keys.shape[0]].all()) or not bool(cp.all(rows == expected[:, None])):
                raise WrongResult("a find after the call does not return the written rows")
        return f"+{size_after - state.size} keys"

    def _check_found(self, op: str, exact: bool, keys: Any) -> str:
        cp = self.cp
        found = self.found[: keys.shape[0]]
        rows = self.out_values[: keys.shape[0]]
        hits = int(found[:N_HIT].sum())
        if bool(found[N_HIT:].any()):
            raise WrongResult(f"{int(found[N_HIT:].sum())} never-inserted keys reported as found")
        if exact and hits != N_HIT:
            raise WrongResult(f"{hits} of {N_HIT} stored keys found")
        if not bool(cp.all(rows[found] == row_values(cp, keys[found])[:, None])):
            raise WrongResult("found rows differ from the stored values")
        if op in ("find_default", "find_or_insert") and not bool(cp.all(rows[~found] == 0)):
            raise WrongResult("rows of missing or new keys are not zeros (no default row or initializers given)")
        return f"hits {hits}/{N_HIT}"


def row_values(cp: Any, keys: Any) -> Any:
    """The value stored in every column of key k's row: k mod 65521, as float32 (exact)."""
    return (keys % VALUE_MODULUS).astype(cp.float32)


def create_table(core: Any, kind: str, mode: str, dim: int, capacity: int) -> Any:
    """A table of the backend whose native module is ``core``, through sok-core's binding of its C ABI."""
    from sparse_operation_kit import _table

    return _table.Table(
        core.storage_api(),
        key_dtype="uint64",
        row_width=dim,
        options=table_options(kind, mode, dim, capacity),
        device=DEVICE,
    )


# -- measurements -------------------------------------------------------------------------------
@dataclass
class Row:
    """One (configuration, table, λ, operation): samples, state and derived figures."""

    mode: str
    dim: int
    capacity: int
    table: str
    lam: float
    op: str
    host_s: list[float] = field(default_factory=list)
    event_s: list[float] = field(default_factory=list)
    load: float | None = None  # keys after the fill / the load base (det: the configuration's capacity)
    table_load: float | None = None  # keys after the fill / the table's own capacity()
    topups: int = 0
    slots: int = 0  # export_batch: slots scanned
    exported: int = 0
    note: str = ""
    error: str = ""
    unsupported: str = ""
    host_g30: float | None = None  # 2^30 KV/s, best host run
    host_g9: float | None = None  # 10^9 KV/s
    event_g9: float | None = None  # 10^9 KV/s, mean event time
    hkv_g30: float | None = None
    vs_hkv: float | None = None
    bound_c: float | None = None
    bound_a: float | None = None
    of_c: float | None = None
    of_a: float | None = None

    def finish(self, hkv_g30: float | None) -> None:
        """Fill in the derived figures from the samples and HKV's figure for this row (2^30 KV/s)."""
        self.hkv_g30 = hkv_g30
        if self.host_s:
            best = min(self.host_s)
            self.host_g30, self.host_g9 = KEYS_PER_CALL / best / 2**30, KEYS_PER_CALL / best / 1e9
            self.vs_hkv = self.host_g30 / self.hkv_g30 if self.hkv_g30 else None
        if self.event_s:
            self.event_g9 = KEYS_PER_CALL / (sum(self.event_s) / len(self.event_s)) / 1e9
        if self.mode == "hybrid":
            return  # rows over PCIe: §5.4 bounds DRAM traffic only
        if self.op == "export_batch":
            if self.exported:
                self.bound_c, self.bound_a = export_bounds(self.dim, self.slots, self.exported)
        else:
            self.bound_c, self.bound_a = key_bounds(self.op, self.dim)
        if self.host_g9 is not None:
            self.of_c = self.host_g9 / self.bound_c if self.bound_c else None
            self.of_a = self.host_g9 / self.bound_a if self.bound_a else None


def measure(cp: Any, bench: TableBench, row: Row, event_calls: int) -> None:
    """HKV's two host-timed runs (each on a fresh fill), then the event-timed calls, into ``row``."""
    exact = bench.kind == "det" or row.lam <= 0.5
    for run in range(HOST_RUNS):
        state = bench.fill(row.lam)
        slots = bench.slots_for(row.op, row.lam, state)
        bench.warmup(row.op)
        keys = bench.batch()
        seconds, result = host_seconds(cp, functools.partial(bench.run, row.op, keys, slots))
        row.host_s.append(seconds)
        if run == 0:
            row.load, row.topups, row.slots = state.load, state.topups, slots
            row.table_load = state.size / bench.table.capacity()
            row.exported = int(result or 0) if row.op == "export_batch" else 0
            row.note = bench.check(row.op, exact, keys, result, state, slots)
    if row.op in INSERTING_OPS:

        def prepare() -> Any:
            bench.fill(row.lam)
            return bench.batch()

    else:

        def prepare() -> Any:
            return keys

    row.event_s = event_seconds(cp, event_calls, prepare, lambda k: bench.run(row.op, k, slots))


def bench_table(
    cp: Any,
    core: Any,
    kind: str,
    cfg: Config,
    lambdas: Sequence[float],
    event_calls: int,
    hkv: HkvBaseline,
    progress: Progress,
) -> tuple[list[Row], str]:
    """Every (λ, operation) of one table, set against ``hkv``; returns the rows and a line
    describing the table."""
    rows = [Row(cfg.mode, cfg.dim, cfg.capacity, kind, lam, op) for lam in lambdas for op in OPS]
    try:
        table = create_table(core, kind, cfg.mode, cfg.dim, cfg.capacity)
    except Exception as error:  # MemoryError, a backend refusing the options: every row says so
        for row in rows:
            row.error = f"table not created: {type(error).__name__}: {error}"
            row.finish(hkv.figure(row.lam, row.op))
            progress.step(f"dim {cfg.dim} {kind}")
        return rows, f"{kind}: not created"
    capacity_before = table.capacity()
    load_base = cfg.capacity if kind == "det" else capacity_before
    bench = TableBench(cp, kind, table, cfg.dim, load_base)
    for row in rows:
        progress.step(f"{cfg.mode} dim {cfg.dim} {kind} λ {row.lam} {row.op}")
        try:
            measure(cp, bench, row, event_calls)
        except NotImplementedError as error:
            row.unsupported = str(error)
        except WrongResult as error:
            row.error = f"wrong results: {error}"
        except Exception as error:  # recorded and printed: one failing operation must not end the run
            row.error = f"{type(error).__name__}: {error}"
        row.finish(hkv.figure(row.lam, row.op))
    options = table_options(kind, cfg.mode, cfg.dim, cfg.capacity)
    grew = "" if table.capacity() == capacity_before else f", grew to {table.capacity()} during the run"
    line = f"{kind}: {table.describe()} (options {options}; capacity() {capacity_before} at creation{grew})"
    del bench, table
    free_device_memory(cp)
    return rows, line


@dataclass
class PooledRow:
    """One pooled lookup: SOK (det or hkv find + sum) or the torch embedding_bag baseline."""

    dim: int
    rows: int
    kind: str  # "det", "hkv" or "torch"
    host_s: list[float] = field(default_factory=list)
    event_s: list[float] = field(default_factory=list)
    error: str = ""
    host_gkeys: float | None = None
    event_gkeys: float | None = None
    vs_torch_host: float | None = None
    vs_torch_event: float | None = None


def time_pooled(cp: Any, row: PooledRow, call: Callable[[], Any], expected: Any, event_calls: int) -> None:
    """Check the pooled rows once, then warm-up, host best-of and event mean, into ``row``."""
    out = call()
    out = out if isinstance(out, cp.ndarray) else cp.from_dlpack(out)
    if not bool(cp.all(out == expected)):
        raise WrongResult("pooled rows differ from the sums of the stored values")
    for _ in range(POOLED_WARMUP):
        call()
    row.host_s = [host_seconds(cp, call)[0] for _ in range(POOLED_HOST_RUNS)]
    row.event_s = event_seconds(cp, event_calls, lambda: None, lambda _: call())
    keys = POOLED_BAGS * POOLED_HOTNESS
    row.host_gkeys = keys / min(row.host_s) / 1e9
    row.event_gkeys = keys / (sum(row.event_s) / len(row.event_s)) / 1e9


def sok_pooled(cp: Any, table: Any, keys: Any, dim: int) -> tuple[Callable[[], Any], Any]:
    """SOK's pooled lookup: find of every key into a (bags x 20, dim) buffer, then a CuPy sum over
    the 20 rows of each bag. Returns the call and the found flags it writes."""
    gathered = cp.empty((keys.shape[0], dim), dtype=cp.float32)
    found = cp.empty(keys.shape[0], dtype=cp.bool_)
    pooled = cp.empty((POOLED_BAGS, dim), dtype=cp.float32)

    def call() -> Any:
        table.find(keys, 0, dim, gathered, None, found)
        return cp.sum(gathered.reshape(POOLED_BAGS, POOLED_HOTNESS, dim), axis=1, out=pooled)

    return call, found


def bench_pooled(
    cp: Any,
    backends: dict[str, Any],
    torch: Any,
    dim: int,
    num_rows: int,
    event_calls: int,
    seed: int,
    progress: Progress,
) -> list[PooledRow]:
    """64 Ki bags x 20 keys drawn uniformly from keys 0 .. num_rows - 1, summed per bag."""
    n = POOLED_BAGS * POOLED_HOTNESS
    ids = cp.asarray(np.random.default_rng(seed).integers(0, num_rows, size=n, dtype=np.int64))
    expected = row_values(cp, ids).reshape(POOLED_BAGS, POOLED_HOTNESS).sum(axis=1)[:, None]
    results = []
    if torch is not None:
        row = PooledRow(dim, num_rows, "torch")
        progress.step(f"pooled dim {dim} torch")
        try:
            weight = row_values(cp, cp.arange(num_rows, dtype=cp.int64))[:, None].repeat(dim, axis=1)
            weight_t = torch.from_dlpack(weight)
            ids_t = torch.from_dlpack(ids)
            offsets = torch.arange(0, n, POOLED_HOTNESS, dtype=torch.int64, device=weight_t.device)

            def embedding_bag() -> Any:
                return torch.nn.functional.embedding_bag(ids_t, weight_t, offsets, mode="sum")

            time_pooled(cp, row, embedding_bag, expected, event_calls)
        except Exception as error:
            row.error = f"{type(error).__name__}: {error}"
        finally:
            weight = weight_t = None
            torch.cuda.empty_cache()
            free_device_memory(cp)
        results.append(row)
    keys = ids.view(cp.uint64)
    for kind, core in backends.items():
        row = PooledRow(dim, num_rows, kind)
        progress.step(f"pooled dim {dim} {kind}")
        try:
            capacity = 1 << (2 * num_rows - 1).bit_length()  # hkv at load 0.5: nothing evicted
            table = create_table(core, kind, "device", dim, num_rows if kind == "det" else capacity)
            bench = TableBench(cp, kind, table, dim, capacity)
            for start in range(0, num_rows, KEYS_PER_CALL):
                bench.insert_range(start, min(KEYS_PER_CALL, num_rows - start))
            call, found = sok_pooled(cp, table, keys, dim)
            call()
            if not bool(found.all()):  # a missing key would read as zeros, the value of keys 65521 x m
                raise WrongResult("a stored key was not found")
            time_pooled(cp, row, call, expected, event_calls)
        except Exception as error:
            row.error = f"{type(error).__name__}: {error}"
        finally:
            bench = table = call = found = None
            free_device_memory(cp)
        results.append(row)
    baseline = next((r for r in results if r.kind == "torch" and not r.error), None)
    for row in results:
        if baseline is not None and row.kind != "torch" and not row.error:
            row.vs_torch_host = row.host_gkeys / baseline.host_gkeys
            row.vs_torch_event = row.event_gkeys / baseline.event_gkeys
    return results


# -- report -------------------------------------------------------------------------------------
def fmt(value: float | None, spec: str = ".3f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def config_report(cfg: Config, rows: list[Row], table_lines: list[str], hkv: HkvBaseline) -> str:
    """The table of one configuration, its tables' descriptions, HKV's source and the bounds it used."""
    lines = [f"== {cfg.title()}, {KEYS_PER_CALL // MI} Mi keys per call =="]
    lines += [f"  {line}" for line in table_lines]
    lines.append(f"  {hkv.describe(cfg.capacity)}")
    header = (
        f"{'op':<17} {'λ':>4} {'table':<5} {'host ms':>8} {'2^30/s':>7} {'1e9/s':>7} {'ev ms':>7} {'ev 1e9/s':>8} "
        f"{hkv.column():>9} {'vs HKV':>7} {'of C':>5} {'of A':>5}  notes"
    )
    lines += [header, "-" * len(header)]
    previous = None
    for row in sorted(rows, key=lambda r: (OPS.index(r.op), r.lam, r.table)):
        if previous is not None and row.op != previous:
            lines.append("")
        previous = row.op
        mean_event = sum(row.event_s) / len(row.event_s) if row.event_s else None
        notes = [row.note] if row.note else []
        if row.load is not None:
            notes.append(f"load {row.load:.3f}" + (f" (own {row.table_load:.3f})" if row.table == "det" else ""))
        if row.topups:
            notes.append(f"{row.topups} top-ups")
        if row.unsupported:
            notes.append(f"unsupported: {row.unsupported}")
        if row.error:
            notes.append(f"ERROR {row.error}")
        lines.append(
            f"{row.op:<17} {row.lam:>4.2f} {row.table:<5} {fmt(min(row.host_s) * 1e3 if row.host_s else None):>8} "
            f"{fmt(row.host_g30):>7} {fmt(row.host_g9):>7} {fmt(mean_event * 1e3 if mean_event else None):>7} "
            f"{fmt(row.event_g9):>8} {fmt(row.hkv_g30):>9} {fmt(row.vs_hkv, '.2f', 'x'):>7} {pct(row.of_c):>5} "
            f"{pct(row.of_a):>5}  {'; '.join(notes)}"
        )
    if cfg.mode == "hybrid":
        lines.append("bounds: none (rows in host memory move over PCIe; §5.4 bounds DRAM traffic)")
    else:
        parts = []
        for op in OPS[:-1]:
            c, a = key_bounds(op, cfg.dim)
            parts.append(f"{op} {fmt(c, '.1f')} / {fmt(a, '.1f')}")
        lines.append("bounds, 10^9 keys/s, Model C min / Bound A: " + ", ".join(parts) + ", export_batch per λ (JSON)")
    return "\n".join(lines)


def pooled_report(rows: list[PooledRow], torch_note: str) -> str:
    lines = [
        f"== pooled lookup: {POOLED_BAGS // 1024} Ki bags x {POOLED_HOTNESS} keys, sum, keys uniform over the "
        f"table's {rows[0].rows // MI if rows else 0} Mi rows =="
    ]
    header = (
        f"{'dim':>4} {'kind':<6} {'host ms':>8} {'G keys/s':>8} {'ev ms':>7} {'ev G keys/s':>11} {'vs torch':>8}  notes"
    )
    lines += [header, "-" * len(header)]
    for row in rows:
        vs = fmt(row.vs_torch_host, ".2f", "x") + " / " + fmt(row.vs_torch_event, ".2f", "x")
        mean_event = sum(row.event_s) / len(row.event_s) if row.event_s else None
        notes = []
        if row.kind == "torch":
            notes.append(f"the issue's reference: {ISSUE_TORCH_GKEYS.get(row.dim, '-')} G keys/s")
        if row.error:
            notes.append(f"ERROR {row.error}")
        lines.append(
            f"{row.dim:>4} {row.kind:<6} {fmt(min(row.host_s) * 1e3 if row.host_s else None):>8} "
            f"{fmt(row.host_gkeys, '.2f'):>8} {fmt(mean_event * 1e3 if mean_event else None):>7} "
            f"{fmt(row.event_gkeys, '.2f'):>11} {vs if row.kind != 'torch' else '':>8}  {'; '.join(notes)}"
        )
    lines.append(
        "SOK = find of every key into a (bags x 20, dim) buffer + CuPy sum over the 20; torch = "
        "embedding_bag(mode='sum') over a weight of as many rows; vs torch = host / event throughput ratio"
        + (f"; {torch_note}" if torch_note else "")
    )
    return "\n".join(lines)


def footnotes(hkv_run: bool) -> str:
    """What the columns mean; ``hkv_run``: HKV's figures come from this run (--hkv), not the constants."""
    if hkv_run:
        hkv = (
            "HKV run: HKV's own merlin_hashtable_benchmark (its test_main, one configuration per process through "
            "benchmarks/hkv_driver.cu) on this GPU in this run, just before our tables of the configuration, at the "
            "capacity named above it"
        )
    else:
        hkv = (
            f"HKV const: {HKV_CONSTANTS_LABEL}: 128 Mi slots at dims 8 and 32 and hybrid, 64 Mi at 64 and 128; "
            "--hkv PATH runs HKV's benchmark in the run instead"
        )
    return f"""\
host: perf_counter around one call + device synchronize, best of {HOST_RUNS} runs, each after clear + refill + \
{WARMUP_CALLS} one-key warm-up calls (HKV's method; HKV clears only before its first run).
ev: CUDA events around each call (after a 1 ms GPU spin that hides the launch), the mean; finds and export_batch \
repeat one batch, every inserting call gets a clear + refill first (so each sees 60% hits / 40% new keys).
find = find_hits (rows of missing keys not written, as HKV's find); find_default = find (missing rows become zeros).
insert_or_assign = insert_or_assign_hinted with SOK_HINT_UNIQUE_KEYS (the keys are distinct; HKV's benchmark \
passes unique_key=true); insert_or_assign_dedup = insert_or_assign without it (every key deduplicated; \
no HKV figure).
{hkv}. HKV's figures: 2^30 KV/s, best of 2 host-timed calls (HKV's timer). \
vs HKV = host 2^30/s over it (det's insert_and_evict never evicts; HKV's export wrote keys and rows, no scores, \
as here).
det never evicts: at each λ it holds λ x capacity keys (load), in a table sized for capacity + {N_NEW:,} keys \
(own = size / its capacity()); hkv holds λ x its capacity and evicts at 1.0.
of C / of A: host 10^9/s over Model C (min) and Bound A of §5.4, computed from §5.3's traffic per key \
(export_batch: streaming traffic, derived here); bounds assume a table in DRAM, not in the 50 MB L2."""


def main(argv: list[str] | None = None) -> int:
    summary, _, method = __doc__.partition("\n\n")
    parser = argparse.ArgumentParser(
        description=summary, epilog=method, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"smoke run: {QUICK_CAPACITY_MI} Mi slots, λ 0.5, dims 8 and 64, 5 event calls, "
        f"{QUICK_POOLED_ROWS // MI} Mi pooled rows",
    )
    parser.add_argument("--dims", type=int, nargs="+", help="row widths (default 8 32 64 128; hybrid runs at 64)")
    parser.add_argument("--lambdas", type=float, nargs="+", help="load factors (default 0.5 0.75 1.0)")
    parser.add_argument(
        "--capacity-mi",
        type=int,
        help="slots of every configuration, Mi, a power of two (default: 64 at dims <= 32, else 32; hybrid 16)",
    )
    parser.add_argument("--tables", nargs="+", choices=tuple(TABLES), default=list(TABLES), help="default: both")
    parser.add_argument("--no-hybrid", action="store_true", help="skip the hybrid configuration")
    parser.add_argument("--no-pooled", action="store_true", help="skip the pooled lookup")
    parser.add_argument("--event-calls", type=int, help="event-timed calls per operation (default 20, quick 5)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the pooled lookup's keys")
    parser.add_argument("--json", metavar="PATH", help="write the configuration, machine and every sample here")
    parser.add_argument(
        "--hkv",
        metavar="PATH",
        help="run HKV's own benchmark beside ours, at our capacities, for the vs HKV column: PATH is a driver built "
        "by benchmarks/build_hkv.sh, or an HKV source tree or git repository to build one from (cached in "
        ".device-hkv/). Without it, vs HKV uses HKV's constant figures of 2026-11-22 at other capacities",
    )
    parser.add_argument(
        "--hkv-timeout",
        type=float,
        default=HKV_TIMEOUT_S,
        help=f"seconds one configuration of HKV's benchmark may take (default {HKV_TIMEOUT_S})",
    )
    args = parser.parse_args(argv)
    dims = args.dims or ([8, 64] if args.quick else [8, 32, 64, 128])
    lambdas = args.lambdas or ([0.5] if args.quick else [0.5, 0.75, 1.0])
    event_calls = args.event_calls or (5 if args.quick else 20)
    capacity_mi = args.capacity_mi or (QUICK_CAPACITY_MI if args.quick else None)
    if capacity_mi is not None and (capacity_mi < 2 or capacity_mi & (capacity_mi - 1)):
        parser.error(f"--capacity-mi {capacity_mi} must be a power of two >= 2 (hkv capacities are)")
    if any(d < 1 for d in dims) or any(not 0 < lam <= 1 for lam in lambdas) or event_calls < 1:
        parser.error("need --dims >= 1, 0 < --lambdas <= 1 and --event-calls >= 1")
    if args.hkv_timeout <= 0:
        parser.error(f"--hkv-timeout {args.hkv_timeout:g} must be > 0 seconds")
    if args.hkv and not Path(args.hkv).exists():
        parser.error(
            f"--hkv {args.hkv!r} does not exist; give a driver built by bash {BUILD_HKV} SOURCE, or an HKV "
            "source tree or git repository to build one from"
        )

    def capacity(mode: str, dim: int) -> int:
        if capacity_mi is not None:
            return capacity_mi * MI
        if mode == "hybrid":
            return DEFAULT_HYBRID_CAPACITY_MI * MI
        return DEFAULT_CAPACITY_MI.get((mode, dim), 64 if dim <= 32 else 32) * MI

    configs = [Config("device", dim, capacity("device", dim)) for dim in dims]
    if HYBRID_DIM in dims and "hkv" in args.tables and not args.no_hybrid:
        configs.append(Config("hybrid", HYBRID_DIM, capacity("hybrid", HYBRID_DIM)))
    if any(cfg.capacity * min(lambdas) < KEYS_PER_CALL for cfg in configs):
        parser.error("capacity x the smallest λ must be at least 1 Mi keys (HKV's batch draws its hits from a fill)")

    cp, backends = load_gpu_stack(args.tables)
    cp.cuda.Device(0).use()
    hkv_driver = hkv_binary(args.hkv, cp.cuda.Device(0).compute_capability) if args.hkv else None
    torch, torch_note = (None, "not used (--no-pooled)") if args.no_pooled else import_torch()
    machine = machine_info(cp, backends, torch, torch_note)
    started = datetime.datetime.now().astimezone()
    print(f"storage_gpu on {machine['gpu']}, {started.isoformat(timespec='seconds')}")
    print(f"command: {shlex.join([sys.executable, *sys.argv])}")
    for key, value in machine.items():
        if isinstance(value, dict):
            value = "; ".join(f"{k}: {v}" for k, v in value.items())
        print(f"  {key:<20} {value}")
    print(
        f"  {'run':<20} dims {dims}, λ {lambdas}, tables {args.tables}, "
        f"{event_calls} event calls, {'quick' if args.quick else 'full'}"
    )
    print(f"  {'HKV':<20} {f'its benchmark in this run: {hkv_driver}' if hkv_driver else HKV_CONSTANTS_LABEL}")

    pooled_rows = QUICK_POOLED_ROWS if args.quick else POOLED_ROWS
    pooled_kinds = 0 if args.no_pooled else len(POOLED_DIMS) * (len(backends) + (torch is not None))
    steps = sum(len(lambdas) * len(OPS) * (1 if cfg.mode == "hybrid" else len(backends)) for cfg in configs)
    progress = Progress(steps + pooled_kinds + (len(configs) if hkv_driver else 0))
    rows: list[Row] = []
    tables: dict[str, list[str]] = {}
    baselines: dict[str, HkvBaseline] = {}
    pooled: list[PooledRow] = []
    try:
        for cfg in configs:
            if hkv_driver:
                progress.step(f"HKV {cfg.mode} dim {cfg.dim}")
                free_device_memory(cp)  # HKV's test_main skips when less HBM is free than its rows take
                hkv = run_hkv(hkv_driver, hkv_plan(cfg, lambdas), args.hkv_timeout)
            else:
                hkv = constant_baseline(cfg.mode, cfg.dim)
            kinds = ["hkv"] if cfg.mode == "hybrid" else list(backends)
            config_rows, lines = [], []
            for kind in kinds:
                table_rows, line = bench_table(cp, backends[kind], kind, cfg, lambdas, event_calls, hkv, progress)
                config_rows += table_rows
                lines.append(line)
            rows += config_rows
            tables[cfg.title()] = lines
            baselines[cfg.title()] = hkv
            progress.write("\n" + config_report(cfg, config_rows, lines, hkv))
        if not args.no_pooled:
            for dim in POOLED_DIMS:
                pooled += bench_pooled(cp, backends, torch, dim, pooled_rows, event_calls, args.seed, progress)
            progress.write("\n" + pooled_report(pooled, torch_note))
    finally:
        progress.close()
    print()
    print(footnotes(hkv_driver is not None))
    elapsed = (datetime.datetime.now().astimezone() - started).total_seconds()
    machine["load_average_end"] = load_average()
    print(f"took {elapsed:.0f} s; load average (1, 5, 15 min) {machine['load_average_end']} at the end")

    failed = [r for r in rows if r.error] + [r for r in pooled if r.error]
    hkv_failed = [title for title, hkv in baselines.items() if hkv.error]
    if failed:
        print(f"{len(failed)} measurements failed or returned wrong results (ERROR above): exit status 1")
    if hkv_failed:
        print(f"HKV's benchmark failed at {len(hkv_failed)} configurations (FAILED above): exit status 1")
    if args.json:
        result = {
            "benchmark": "storage_gpu",
            "date": started.isoformat(timespec="seconds"),
            "command": shlex.join([sys.executable, *sys.argv]),
            "config": {k: v for k, v in vars(args).items() if k != "json"}
            | {"dims": dims, "lambdas": lambdas, "event_calls": event_calls, "keys_per_call": KEYS_PER_CALL},
            "machine": machine,
            "tables": tables,
            "rows": [asdict(r) for r in rows],
            "pooled": [asdict(r) for r in pooled],
            "hkv_source": f"this run: {hkv_driver}" if hkv_driver else HKV_CONSTANTS_LABEL,
            "hkv": {title: asdict(hkv) for title, hkv in baselines.items()},
            "elapsed_s": elapsed,
        }
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.json}")
    return 1 if failed or hkv_failed else 0


if __name__ == "__main__":
    sys.exit(main())
