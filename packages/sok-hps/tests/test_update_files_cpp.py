"""The online updates in C++ (csrc/serving/update_files.cpp, update_source.cpp): what
test_updates.py and test_update_poller.py do not reach.

* Files of the documented layout, made here with struct and zlib as sok-hps's Python writer made
  them (versions 1 and 2, NaN payloads, every key bit), are read bit for bit; the C++ writer
  writes those bytes; rows that straddle the reader's 8 MiB chunks come back whole.
* Every truncation and every flipped byte of a file gets the verdict and the message of a reader
  written here after the documented format and the Python reader's words.
* 8 threads writing and reading at once: one writer id per thread, sequences all distinct and
  increasing per thread, every file read back.
* Reading and writing run without the GIL (another thread counts meanwhile).
* The source's C++ thread (start without launch), its stderr log sink, its own steady clock.
* Model filters match as Python's re.fullmatch; a filter re.compile refuses raises what it raises.
* A name that is not UTF-8 is named as os.fsdecode reads it.
* The interpreter exits cleanly while the source's daemon thread applies, logs, reads or waits.
* A C++ process with no Python (update_source_program.cpp, built from sok_hps_serving_core's
  sources) writes updates and applies them in the source's own thread, its lines on stderr.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from hierarchical_parameter_server import _serving, updates
from hierarchical_parameter_server.updates import (
    DirectoryUpdateSource,
    UpdateFileError,
    read_update,
    write_update,
)

MAGIC, HEAD, ORDER = 0x52544348, struct.Struct("<IIHHI"), struct.Struct("<QQ")
TAG = re.compile(r"hps_et\.([a-zA-Z0-9_\-]{1,120})\.([a-zA-Z0-9_\-]{1,120})")


def reference_file(tag: bytes, keys: np.ndarray, values: np.ndarray, version: int = 2, sequence=0, writer=0) -> bytes:
    """An update file as the module docstring of updates.py lays it out (sok-hps's Python writer)."""
    count, dim = values.shape
    pairs = np.empty(count, np.dtype([("key", "<i8"), ("value", "<f4", (dim,))]))
    pairs["key"], pairs["value"] = keys.view(np.int64), values
    body = HEAD.pack(MAGIC, 4 * dim, version, 8, len(tag))
    body += (ORDER.pack(sequence, writer) if version >= 2 else b"") + tag + struct.pack("<Q", count) + pairs.tobytes()
    return body + struct.pack("<I", zlib.crc32(body))


def reference_read(data: bytes, path: str) -> tuple:
    """("ok", tag, keys bits, values bits, sequence, version, checksum, writer), or (error class
    name, message): the verdict of the format's reader, in the words of sok-hps's Python reader."""
    size = len(data)

    def incomplete(expected: str) -> tuple:
        return (
            "UpdateIncomplete",
            f"update file {path}: {size} bytes, but {expected}: incomplete (truncated, or still being copied in)",
        )

    def bad(what: str) -> tuple:
        return ("UpdateFileError", f"update file {path}: {what}")

    if size < HEAD.size:
        if not b"HCTR".startswith(data[:4]):
            return bad(f"it starts with {data[:4]!r}, not {b'HCTR'!r}: not an update file")
        return incomplete("the header alone is 16 bytes")
    magic, value_size, version, key_size, tag_len = HEAD.unpack_from(data)
    if magic != MAGIC:
        return bad(f"magic {magic:#010x} is not {MAGIC:#010x}: not an update file")
    if version not in (1, 2):
        return bad(f"format version {version} is not 1 or 2; write it with this version of sok-hps")
    if key_size != 8 or value_size < 4 or value_size % 4:
        return bad(f"key size {key_size} / value size {value_size}: expected 8-byte keys and float32 rows")
    if tag_len > 248:
        return bad(f"tag length {tag_len} is over 248: not an update file")
    fixed = HEAD.size + (ORDER.size if version >= 2 else 0)
    header_size = fixed + tag_len + 8
    if size < header_size:
        return incomplete(f"its header is {header_size} bytes")
    tag = data[fixed : fixed + tag_len].decode(errors="replace")
    if not TAG.fullmatch(tag):
        return bad(f"tag {tag!r} is not hps_et.<model>.<table>")
    (count,) = struct.unpack_from("<Q", data, fixed + tag_len)
    dim = value_size // 4
    expected = header_size + count * (8 + 4 * dim) + 4
    what = f"its header says {count} rows of dim {dim} ({expected} bytes)"
    if size < expected:
        return incomplete(what)
    if size > expected:
        return bad(f"{size} bytes, but {what}: data after the end")
    if version >= 2:
        sequence, writer = ORDER.unpack_from(data, HEAD.size)
    else:
        name, writer = os.path.basename(path), 0
        if not re.match(r"\d{20}-", name):
            return bad(
                "format version 1 orders a file by the time its name starts with (<20 digits>-<pid>-<counter>.hpsu), "
                f"and {name!r} has none; give it back its name, or write its rows again with write_update"
            )
        sequence = int(name[:20])
    checksum = zlib.crc32(data[:-4])
    if struct.unpack_from("<I", data, size - 4)[0] != checksum:
        return bad("checksum mismatch: the file is corrupt")
    rows = np.frombuffer(data, np.dtype([("key", "<i8"), ("value", "<f4", (dim,))]), count, header_size)
    return ("ok", tag, rows["key"].tobytes(), rows["value"].tobytes(), sequence, version, checksum, writer)


def outcome(path: str) -> tuple:
    """What read_update (the C++ reader) makes of the file at path, as reference_read says it."""
    try:
        u = read_update(path)
    except (UpdateFileError, OSError) as error:
        return (type(error).__name__, str(error))
    assert u.keys.dtype == np.int64 and u.values.dtype == np.float32 and u.values.flags.c_contiguous
    return ("ok", u.tag, u.keys.tobytes(), u.values.tobytes(), u.sequence, u.version, u.checksum, u.writer)


def odd_floats(shape: tuple[int, int], seed: int) -> np.ndarray:
    """float32 rows of every kind of bit pattern: NaNs with payloads (quiet and signalling), -0.0,
    infinities, subnormals and random bits."""
    bits = np.random.default_rng(seed).integers(0, 2**32, shape, dtype=np.uint64).astype(np.uint32)
    special = np.array([0x7FC00001, 0x7F800001, 0xFFFFFFFF, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001], np.uint32)
    bits.reshape(-1)[: min(bits.size, special.size)] = special[: bits.size]
    return bits.view(np.float32)


def every_key_bit(count: int, seed: int) -> np.ndarray:
    keys = np.random.default_rng(seed).integers(0, 2**64, count, dtype=np.uint64)
    keys[: min(count, 3)] = np.array([0, 2**63, 2**64 - 1], np.uint64)[: min(count, 3)]
    return keys


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize(("count", "dim"), [(0, 1), (1, 3), (1000, 129)])
def test_files_of_the_documented_layout_are_read_bit_for_bit(tmp_path, version, count, dim):
    keys, values = every_key_bit(count, seed=count), odd_floats((count, dim), seed=dim)
    data = reference_file(b"hps_et.model-1.table_2", keys, values, version, 2**64 - 2, 0x0123456789ABCDEF)
    path = str(tmp_path / "01760000000000000007-42-000003.hpsu")
    open(path, "wb").write(data)
    assert outcome(path) == reference_read(data, path)
    update = read_update(path)
    assert update.keys.view(np.uint64).tolist() == keys.tolist()
    assert update.values.view(np.uint32).tobytes() == values.view(np.uint32).tobytes()
    assert (update.sequence, update.writer) == (
        (2**64 - 2, 0x0123456789ABCDEF) if version == 2 else (1760000000000000007, 0)
    )
    assert (update.checksum, update.version, update.model, update.table) == (
        zlib.crc32(data[:-4]),
        version,
        "model-1",
        "table_2",
    )


def cpp_write_update(directory, model: str, table: str, keys: np.ndarray, values: np.ndarray) -> str:
    """The C++ writer's whole write, as a C++ process writes an update (the rename too)."""
    return _serving.write_update(str(directory), model, table, keys.view(np.int64), values)


@pytest.mark.parametrize("writer", [write_update, cpp_write_update])
@pytest.mark.parametrize(("count", "dim"), [(0, 2), (5, 1), (20000, 257)])  # the last: 20.6 MB, 3 chunks
def test_the_writer_writes_the_documented_bytes(tmp_path, count, dim, writer):
    keys, values = every_key_bit(count, seed=1), odd_floats((count, dim), seed=2)
    path = writer(tmp_path, "m", "t", keys, values)
    assert os.listdir(tmp_path) == [os.path.basename(path)]  # no temporary file left
    data = open(path, "rb").read()
    sequence, writer_id = ORDER.unpack_from(data, HEAD.size)
    assert data == reference_file(b"hps_et.m.t", keys, values, 2, sequence, writer_id)
    assert re.fullmatch(rf"{sequence:020d}-{os.getpid()}-\d{{6,}}\.hpsu", os.path.basename(path))
    assert outcome(path) == reference_read(data, path)


def test_rows_that_straddle_the_readers_chunks_come_back_whole(tmp_path):
    dim = 1001  # 4012-byte rows: 8 MiB holds no whole number of them
    count = 3 * _serving.UPDATE_CHUNK_BYTES // (8 + 4 * dim) + 7
    keys, values = every_key_bit(count, seed=3), odd_floats((count, dim), seed=4)
    path = str(tmp_path / "00000000000000000001-1-000000.hpsu")
    data = reference_file(b"hps_et.m.t", keys, values, 2, 1, 1)
    open(path, "wb").write(data)
    assert outcome(path) == reference_read(data, path)


@pytest.mark.parametrize("version", [1, 2])
def test_every_truncation_and_flipped_byte_gets_the_reference_verdict(tmp_path, version):
    data = reference_file(b"hps_et.m.tab", np.array([1, -2], np.int64), odd_floats((2, 3), seed=5), version, 7, 9)
    path = str(tmp_path / "00000000000000000005-1-000000.hpsu")
    cases = [data[:cut] for cut in range(len(data))] + [data + b"\0"]
    for at in range(len(data)):
        for flip in (0x01, 0x80, 0xFF):
            cases.append(data[:at] + bytes([data[at] ^ flip]) + data[at + 1 :])
    verdicts = set()
    for case in cases:
        open(path, "wb").write(case)
        expected = reference_read(case, path)
        assert outcome(path) == expected, case
        verdicts.add(expected[1].split(": ", 1)[1][:14] if expected[0] != "ok" else "ok")
    assert len(verdicts) >= 8  # the cases reach the reader's checks, not one of them


def test_a_version_1_name_without_its_time_is_refused(tmp_path):
    data = reference_file(b"hps_et.m.t", np.array([1], np.int64), np.ones((1, 2), np.float32), version=1)
    for name in ("renamed.hpsu", "0000000000000000001-1-000000.hpsu", "0000000000000000000x-1.hpsu"):
        open(tmp_path / name, "wb").write(data)
        assert outcome(str(tmp_path / name)) == reference_read(data, str(tmp_path / name))
        assert "has none" in outcome(str(tmp_path / name))[1]


def test_eight_threads_write_and_read_at_once(tmp_path):
    files_per_thread, results, errors = 25, {}, []
    barrier = threading.Barrier(8)

    def work(index: int) -> None:
        try:
            barrier.wait()
            mine = []
            for i in range(files_per_thread):
                keys = np.arange(i, i + 50, dtype=np.int64) * 8 + index
                path = write_update(tmp_path, f"m{index}", "t", keys, np.full((50, 4), index + i / 100, np.float32))
                update = read_update(path)
                np.testing.assert_array_equal(update.keys, keys)
                np.testing.assert_array_equal(update.values, np.full((50, 4), index + i / 100, np.float32))
                mine.append((update.sequence, update.writer, os.path.basename(path)))
            results[index] = mine
        except BaseException as error:  # noqa: BLE001 -- reported by the test
            errors.append(error)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors and len(results) == 8
    writers = {index: {writer for _, writer, _ in mine} for index, mine in results.items()}
    assert all(len(w) == 1 and 0 not in w for w in writers.values())
    assert len(set().union(*writers.values())) == 8  # one id per thread
    sequences = [sequence for mine in results.values() for sequence, _, _ in mine]
    assert len(set(sequences)) == len(sequences) == 8 * files_per_thread
    assert all([s for s, _, _ in mine] == sorted(s for s, _, _ in mine) for mine in results.values())
    names = {name for mine in results.values() for _, _, name in mine}
    assert names == set(os.listdir(tmp_path)) and len(names) == 8 * files_per_thread


class GilWatch:
    """A thread that notes the time every 1000th turn of its loop while `watching`: it runs only
    while no other thread holds the GIL."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.watching = self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        turn = 0
        while not self._stop:
            turn += 1
            if turn % 1000 == 0 and self.watching:
                self.times.append(time.monotonic())

    def longest_pause(self, begin: float, end: float) -> float:
        """The longest time in [begin, end] in which the thread did not run."""
        inside = [begin] + [t for t in self.times if begin < t < end] + [end]
        return max(b - a for a, b in zip(inside, inside[1:]))

    def __enter__(self) -> GilWatch:
        self._thread.start()
        self.watching = True
        return self

    def __exit__(self, *exc) -> None:
        self._stop = True
        self._thread.join(timeout=10)


def test_a_file_is_written_and_read_without_the_gil(tmp_path):
    count, dim = 1 << 17, 128  # 68 MB of rows
    began = []

    def read_into(n: int, d: int) -> tuple[np.ndarray, np.ndarray]:
        began.append(time.monotonic())  # the C++ reader reads the rows once this returns
        return np.empty(n, np.int64), np.empty((n, d), np.float32)

    with GilWatch() as watch:
        write_began = time.monotonic()
        temporary, path = _serving.stage_update(
            str(tmp_path), "m", "t", np.arange(count, dtype=np.int64), np.ones((count, dim), np.float32)
        )
        write_ended = time.monotonic()
        fields = _serving.read_update(temporary, read_into)
        read_ended = time.monotonic()
    assert fields[1][-1] == count - 1 and fields[2].shape == (count, dim)
    assert path.endswith(".hpsu") and os.path.basename(temporary).startswith(".")
    # a call that held the GIL would be one pause of the watching thread, as long as the call
    writing, reading = write_ended - write_began, read_ended - began[0]
    assert watch.longest_pause(write_began, write_ended) < writing / 2, f"writing took {writing:.3f} s"
    assert watch.longest_pause(began[0], read_ended) < reading / 2, f"reading took {reading:.3f} s"


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the condition was not met in time"
        time.sleep(0.01)


def native_source(directory, **options) -> _serving.UpdateSource:
    """A _serving.UpdateSource without updates.py's layer: log to stderr, its own clock, unless given."""
    arguments = {"poll_interval_s": 0.01, "model_filters": (".+",), "incomplete_timeout_s": 300.0, "log": None}
    arguments |= {"clock": None, "read_into": updates._read_into} | options
    return _serving.UpdateSource(str(directory), **arguments)


def test_the_cpp_thread_applies_in_order_retries_and_stops(tmp_path):
    applied, threads, failures = [], set(), []

    def apply(fields) -> None:
        threads.add(threading.current_thread().name)
        key = int(fields[1][0])
        if key == 2 and len(failures) < 2:
            failures.append(key)
            raise RuntimeError("tier down (test)")
        applied.append(key)

    for key in range(5):
        write_update(tmp_path, "m", "t", [key], np.ones((1, 2)))
    source = native_source(tmp_path)
    source.start(apply)  # no launch: a std::thread of the source's own
    try:
        with pytest.raises(RuntimeError, match="runs already"):
            source.start(apply)
        wait_for(lambda: len(applied) == 5)
    finally:
        assert source.stop(5.0)
    assert applied == [0, 1, 2, 3, 4] and failures == [2, 2]
    (thread,) = threads  # one thread Python did not start: threading names it Dummy-<n>
    assert thread.startswith("Dummy-")
    assert source.stop(5.0)  # idempotent


def test_the_stderr_sink_writes_each_line(tmp_path, capfd):
    (tmp_path / "junk.hpsu").write_bytes(b"JUNK" * 8)
    source = native_source(tmp_path, incomplete_timeout_s=0.0)
    assert source.poll() == []
    err = capfd.readouterr().err
    assert err == (
        f"sok-hps updates ERROR: update file {tmp_path}/junk.hpsu: magic 0x4b4e554a is not 0x52544348: not an update "
        f"file; moved it to {tmp_path}/rejected/junk.hpsu\n"
    )


def test_the_sources_own_clock_times_an_incomplete_file(tmp_path):
    data = reference_file(b"hps_et.m.t", np.array([1], np.int64), np.ones((1, 2), np.float32), 2, 1, 1)
    (tmp_path / "part.hpsu").write_bytes(data[:20])
    lines = []
    source = native_source(tmp_path, incomplete_timeout_s=0.3, log=lambda level, message, error: lines.append(message))
    began = time.monotonic()
    assert source.poll() == [] and not (tmp_path / "rejected").exists()
    while time.monotonic() - began < 0.3:
        assert source.poll() == []
        time.sleep(0.02)
    wait_for(lambda: source.poll() == [] and (tmp_path / "rejected").exists(), timeout=2)
    assert time.monotonic() - began >= 0.3
    assert lines[0].endswith("reading it again until it is complete")
    assert lines[-1].endswith(
        "its size has not changed for 0.3 s; moved it to " + str(tmp_path / "rejected" / "part.hpsu")
    )


MODELS = ["a", "ab", "abc", "b", "ac", "aa", "aaa", "aaaa", "a_x", "abc_x", "foo", "foobar", "x", "A-1", "1_2"]


@pytest.mark.parametrize(
    "patterns",
    [["a|ab"], ["ab?"], ["a.*"], ["[a-c]+_x"], ["foo", "b"], [".+"], ["(a|b)c"], ["a{2,3}"], [r"\w+"], ["x*"], []],
)
def test_model_filters_match_as_pythons_re_fullmatch(tmp_path, patterns):
    for model in MODELS:
        write_update(tmp_path, model, "t", [1], np.ones((1, 2)))
    got = [u.model for u in DirectoryUpdateSource(tmp_path, model_filters=patterns).poll()]
    assert sorted(got) == sorted(m for m in MODELS if any(re.fullmatch(p, m) for p in patterns))


@pytest.mark.parametrize("pattern", ["(", "a{2,1}", "[z-a]", "(?<=a+)b", "a**", "\\"])
def test_a_filter_re_compile_refuses_raises_what_it_raises(tmp_path, pattern):
    with pytest.raises(Exception) as expected:
        re.compile(pattern)
    with pytest.raises(type(expected.value)) as caught:
        DirectoryUpdateSource(tmp_path, model_filters=[pattern])
    assert str(caught.value) == str(expected.value)


def test_a_filter_only_pythons_re_takes_is_refused_with_a_fix(tmp_path):
    with pytest.raises(ValueError, match=r"model filter '\(\?P<m>a\)' is a regular expression of Python's re"):
        DirectoryUpdateSource(tmp_path, model_filters=["(?P<m>a)"])


def test_a_name_that_is_not_utf8_is_named_as_os_fsdecode_reads_it(tmp_path, caplog):
    junk = os.path.join(os.fsencode(tmp_path), b"caf\xe9-\xff.hpsu")
    with open(junk, "wb") as f:
        f.write(b"JUNK" * 8)
    with caplog.at_level(logging.ERROR, logger="hierarchical_parameter_server.updates"):
        assert DirectoryUpdateSource(tmp_path).poll() == []
    (line,) = [r.getMessage() for r in caplog.records]
    name = os.fsdecode(b"caf\xe9-\xff.hpsu")
    assert line.startswith(f"update file {tmp_path}/{name}: magic") and line.endswith(f"rejected/{name}")
    assert os.listdir(os.path.join(os.fsencode(tmp_path), b"rejected")) == [b"caf\xe9-\xff.hpsu"]


EXIT_WHILE_RUNNING = """
import logging, os, sys, threading, time, types
import numpy as np
from hierarchical_parameter_server import updates
directory, when = sys.argv[1], sys.argv[2]
busy = threading.Event()
def apply(update):
    busy.set()
    if when == "apply":
        time.sleep(0.3)
class Slow(logging.Handler):
    def emit(self, record):
        busy.set()
        time.sleep(0.3)
logging.getLogger("hierarchical_parameter_server.updates").addHandler(Slow())
for i in range(20):
    rows = 1 << 16 if when == "read" else 1
    updates.write_update(directory, "m", "t", np.arange(rows), np.ones((rows, 64 if when == "read" else 1)))
    if when == "log":
        open(os.path.join(directory, f"junk{i}.hpsu"), "wb").write(b"JUNK" * 8)
source = updates.DirectoryUpdateSource(directory, poll_interval_s=0.01)
source.start(apply)
busy.wait(10)
if when == "wait":
    time.sleep(0.5)
class Finalizer:
    def __del__(self, sleep=time.sleep):
        sleep(1.0)  # the interpreter, finalizing, lets go of the GIL: the source's thread wakes and is ended
holder = types.ModuleType("holder")
holder.finalizer = Finalizer()
sys.modules["holder"] = holder
print("exiting", flush=True)
"""


@pytest.mark.parametrize("when", ["apply", "log", "read", "wait"])
def test_the_interpreter_exits_cleanly_while_the_source_runs(tmp_path, when):
    done = subprocess.run(
        [sys.executable, "-c", EXIT_WHILE_RUNNING, str(tmp_path / "u"), when],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stdout) == (0, "exiting\n"), done.stderr
    assert "terminate" not in done.stderr and "Fatal" not in done.stderr


PACKAGE = Path(__file__).resolve().parents[1]


def core_sources() -> list[Path]:
    """The C++ sources of sok_hps_serving_core, as CMakeLists.txt lists them (not the generated
    Unicode tables, which generated_tables writes)."""
    listed = re.search(
        r"add_library\(\s*sok_hps_serving_core STATIC\s+([^)]*)\)", (PACKAGE / "CMakeLists.txt").read_text()
    )
    return [PACKAGE / source for source in listed.group(1).split() if source.endswith(".cpp")]


def generated_tables(directory: Path) -> Path:
    """``directory``, with the Unicode tables py_text.cpp includes, written by this Python as the
    build writes them (csrc/serving/gen_unicode_tables.py)."""
    script = PACKAGE / "csrc" / "serving" / "gen_unicode_tables.py"
    subprocess.run([sys.executable, str(script), str(directory / "unicode_tables.inc")], check=True)
    return directory


def test_a_cpp_process_applies_updates_with_no_python(tmp_path):
    compiler = shutil.which("g++") or shutil.which("c++")
    include = PACKAGE.parent / "sok-core" / "src" / "sparse_operation_kit" / "include"
    if compiler is None or not include.is_dir():
        pytest.skip("no C++ compiler, or no sok-core checkout beside sok-hps")
    sources = [Path(__file__).with_name("update_source_program.cpp"), *core_sources()]
    flags = [
        "-std=c++17",
        "-O0",
        f"-I{PACKAGE / 'csrc' / 'serving'}",
        f"-I{PACKAGE / 'csrc' / 'tiers'}",
        f"-I{include}",
        f"-I{generated_tables(tmp_path)}",
    ]

    def compile_one(source: Path) -> Path:
        target = tmp_path / (source.stem + ".o")
        built = subprocess.run([compiler, *flags, "-c", str(source), "-o", str(target)], capture_output=True, text=True)
        assert built.returncode == 0, built.stderr[-3000:]
        return target

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        objects = list(pool.map(compile_one, sources))
    program = tmp_path / "update_source_program"
    linked = subprocess.run(
        [compiler, *map(str, objects), "-pthread", "-o", str(program)], capture_output=True, text=True
    )
    assert linked.returncode == 0, linked.stderr[-3000:]
    directory = tmp_path / "u"
    done = subprocess.run([str(program), str(directory)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "stopped 1\napplied 0\napplied 3\nunapplied rows of width 2, but the table's dim is 3\nlibpython: absent\n"
    )
    written = {int(read_update(directory / name).keys[0]): name for name in os.listdir(directory)}
    assert sorted(written) == [0, 1, 2, 3]  # the C++ writer's files, read by updates.py
    assert done.stderr.splitlines() == [
        f"sok-hps updates ERROR: update file {directory / written[2]} cannot be applied by this server: rows of "
        "width 2, but the table's dim is 3; nothing of it applied, the file left in place for other readers and not "
        "tried again by this source (restart the server to try it again)",
        f"sok-hps updates WARNING: applying update {directory / written[3]} failed (runtime_error: tier down); trying "
        "it again at every poll",
        f"sok-hps updates WARNING: update {directory / written[3]} applied after it failed",
    ]
