"""Worker of the multi-process lookup tests: runs every check of ``lookup_checks.CHECKS`` on each rank.

Run it under Horovod (``tests/test_lookup_sparse_multiprocess.py`` does)::

    horovodrun -np 2 -H localhost:2 --gloo python lookup_worker.py [check names...]

Each rank prints one line per check, ``CHECK <name> rank=<r> PASS`` or ``CHECK <name> rank=<r> FAIL
<what differed>``, then ``WORKER rank=<r> DONE passed=<p> failed=<f>``, and exits 1 if a check
failed. A watchdog ends a check that does not finish (a collective that never completes) with
``FAIL hang`` and exits the process, so a broken exchange cannot stall the run.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
# Two ranks share the machine's cores: one thread per op keeps them from fighting over them.
os.environ.setdefault("TF_NUM_INTRAOP_THREADS", "1")

import horovod.tensorflow as hvd  # noqa: E402
import sparse_operation_kit as sok  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import lookup_checks  # noqa: E402
from harness import print_stacks_before_timeout  # noqa: E402

#: Seconds a check may take before the watchdog calls it a hang (checks in LAST: shorter, they are
#: the ones expected to hang when they fail).
TIMEOUT_S = 120
LAST_TIMEOUT_S = 8


def _one_line(text: str) -> str:
    return " | ".join(line.strip() for line in str(text).splitlines() if line.strip())


def run_check(name: str, comm: lookup_checks.Comm) -> bool:
    timeout = LAST_TIMEOUT_S if name in lookup_checks.LAST else TIMEOUT_S

    def hang() -> None:
        last = f"; last: {lookup_checks.NOTES[-1]}" if lookup_checks.NOTES else ""
        print(
            f"CHECK {name} rank={comm.rank} FAIL hang: no result within {timeout} s "
            f"(a collective did not complete: the ranks are out of step){last}",
            flush=True,
        )
        os._exit(1)

    watchdog = threading.Timer(timeout, hang)
    watchdog.daemon = True
    watchdog.start()
    start = time.perf_counter()
    lookup_checks.NOTES.clear()
    try:
        lookup_checks.CHECKS[name](comm)
        status = "PASS"
    except Exception as error:  # noqa: BLE001 - every failure is reported, then the next check runs
        status = f"FAIL {type(error).__name__}: {_one_line(error)}"
        if not isinstance(error, AssertionError):
            status += " || " + _one_line("".join(traceback.format_exception(error)[-4:]))
    # Wait for every rank before the next check (under the watchdog too).
    comm.allgather_object(name, name="check_done")
    watchdog.cancel()
    print(f"CHECK {name} rank={comm.rank} {status} ({time.perf_counter() - start:.1f} s)", flush=True)
    return status == "PASS"


def main(selected: list[str]) -> int:
    print_stacks_before_timeout()
    hvd.init()
    comm = lookup_checks.Comm.horovod()
    names = [n for n in lookup_checks.CHECKS if not selected or n in selected]
    unknown = set(selected) - set(lookup_checks.CHECKS)
    if unknown:
        print(f"unknown checks {sorted(unknown)}; valid: {list(lookup_checks.CHECKS)}", flush=True)
        return 2
    results = [run_check(n, comm) for n in names if n in lookup_checks.PRE_INIT]
    sok.init()
    results += [run_check(n, comm) for n in names if n not in lookup_checks.PRE_INIT]
    failed = results.count(False)
    print(f"WORKER rank={comm.rank} DONE passed={len(results) - failed} failed={failed}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
