"""The C++ reader of ``sparse_files`` (``_serving.open_table``, csrc/serving/model_files.hpp) against
model_files.py, the oracle: for every table of test_model_files.py and more, the same keys and rows
to the bit (every chunk size), the same checksums found (at open, by ``verify()``, after the last
chunk), and for every bad table the same exception with the same message.

* Sparse-model directories: good ones (symbolic links followed), every size and dim error.
* Checkpoints without manifest (NVIDIA SOK's layout): int32, uint32, int64 and uint64 keys, empty
  tables, every header, size and file error, paths written in other ways.
* Checkpoints with a manifest: every field of the manifest and of a table entry wrong in each way
  format.py checks, JSON and UTF-8 errors (and random bytes), names refused, a table not listed,
  rows, dims, key dtypes and checksums that differ, staging directories.
* ``sok.dump`` of real tables: a DynamicVariable trained a step, sok.Variable tables of float32,
  float16 and bfloat16 rows (written widened to float32).
* The C++ constants that mirror Python ones equal them.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hierarchical_parameter_server import model_files as mf
from sparse_operation_kit import dtypes
from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt

sys.path.insert(0, str(Path(__file__).parent))
from test_model_files import DIM, nvidia_checkpoint, sok_dump, write_hps  # noqa: E402

_serving = pytest.importorskip("hierarchical_parameter_server._serving")

CHUNK_ROWS = (1, 3, 4096)


def outcome(call):
    try:
        return call(), None
    except Exception as error:  # noqa: BLE001 -- compared with the other reader's
        return None, error


def assert_same_error(py_error: BaseException | None, cpp_error: BaseException | None) -> None:
    assert py_error is not None and cpp_error is not None, (py_error, cpp_error)
    if isinstance(py_error, mf.ModelFileError):
        assert isinstance(cpp_error, _serving.ModelFileError), repr(cpp_error)
    else:
        assert type(py_error) in (ValueError, IsADirectoryError), repr(py_error)
        assert type(cpp_error) is type(py_error), repr(cpp_error)
    # A checkpoint file that is a directory: Python's os.fdopen names the descriptor, the C++ reader nothing.
    assert str(cpp_error) == re.sub(r"(\[Errno 21\] Is a directory): \d+$", r"\1", str(py_error))


def read_chunks(table, chunk_rows: int):
    parts = []
    try:
        for keys, rows in table.chunks(chunk_rows):
            parts.append((keys, rows))
    except Exception as error:  # noqa: BLE001 -- compared with the other reader's
        return parts, error
    return parts, None


def assert_same(path, dim: int):
    """Both readers open ``path``: the same error, or the same table, chunks and checksums. Returns
    the Python reader's error (None when it reads)."""
    want, py_error = outcome(lambda: mf.open_table(path, dim))
    got, cpp_error = outcome(lambda: _serving.open_table(path, dim))
    if py_error is not None or cpp_error is not None:
        assert_same_error(py_error, cpp_error)
        return py_error
    assert (got.path, got.rows, got.dim, got.format) == (want.path, want.rows, want.dim, want.format)
    assert got.keys.dtype == np.int64 and not got.keys.flags.writeable
    np.testing.assert_array_equal(got.keys, want.keys)
    verified = [outcome(table.verify)[1] for table in (want, got)]
    if verified != [None, None]:
        assert_same_error(*verified)
    for chunk_rows in CHUNK_ROWS:
        (want_parts, py_error), (got_parts, cpp_error) = read_chunks(want, chunk_rows), read_chunks(got, chunk_rows)
        assert len(got_parts) == len(want_parts)
        for (want_keys, want_rows), (got_keys, got_rows) in zip(want_parts, got_parts):
            assert got_keys.dtype == np.int64 and got_rows.dtype == np.float32 and got_rows.shape == want_rows.shape
            assert got_keys.tobytes() == want_keys.tobytes() and got_rows.tobytes() == want_rows.tobytes()
            assert got_rows.flags.writeable and got_rows.flags.c_contiguous
        if py_error is not None or cpp_error is not None:
            assert_same_error(py_error, cpp_error)
    return None


def expect(path, dim: int, words: str | None) -> None:
    """assert_same, and the Python reader reads (``words`` None) or fails with ``words`` in its message."""
    error = assert_same(path, dim)
    if words is None:
        assert error is None, error
    else:
        assert error is not None and words in str(error), error


KEYS = np.array([5, -3, 1 << 40, 0, 77, -(1 << 62)], np.int64)


def rows_of(count: int, dim: int = DIM) -> np.ndarray:
    """Random rows, the first holding the float bits that must pass untouched (NaN payloads, -0.0,
    infinities, a subnormal)."""
    rows = np.random.default_rng(count).standard_normal((count, dim)).astype(np.float32)
    special = np.array([0x7FC00001, 0x80000000, 0x7F800000, 0xFF800000, 0x00000001, 0xFFFFFFFF], np.uint32)
    rows[0] = special[:dim].view(np.float32) if dim <= len(special) else rows[0]
    return rows


def headed(path, head: bytes, data: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(head + data.tobytes())


def checkpoint(path, keys=KEYS, rows=None, edit=None, raw: bytes | None = None, table: str = "emb_0") -> str:
    """One table in a checkpoint with a manifest as sok.dump writes it; ``edit(manifest dict,
    table entry)`` changes it before it is written, ``raw`` replaces its bytes. Returns the table's entry."""
    rows = rows_of(len(keys)) if rows is None else rows
    os.makedirs(path)
    files = {
        fmt.key_file(table): fmt.header(fmt.FILE_KEY, keys.dtype.name) + keys.tobytes(),
        fmt.weight_file(table): fmt.header(fmt.FILE_WEIGHT, "float32") + rows.tobytes(),
    }
    for name, data in files.items():
        with open(os.path.join(path, name), "wb") as f:
            f.write(data)
    entry = fmt.TableEntry(
        dim=rows.shape[1] if rows.ndim == 2 else DIM,
        rows=len(keys),
        key_dtype=keys.dtype.name,
        slots=[],
        variable=f"{table}:0",
        kind="static",
        crc32={name: f"{fmt.update_crc32(data):08x}" for name, data in files.items()},
    )
    manifest = fmt.Manifest(tables={table: entry}, world_size=1, optimizer=None, step=None).to_dict()
    if edit is not None:
        edit(manifest, manifest["tables"][table])
    with open(os.path.join(path, fmt.MANIFEST), "wb") as f:
        f.write(raw if raw is not None else json.dumps(manifest).encode())
    return os.path.join(path, table)


# --- sparse-model directories (test_model_files.py's, and more) -------------------------------------


@pytest.mark.parametrize("count", [1, 100])
def test_hps_directory_reads_the_same(tmp_path, count):
    rng = np.random.default_rng(1)
    keys = rng.permutation(10_000)[:count].astype(np.int64) - 50
    expect(write_hps(tmp_path / "t", keys, rows_of(count)), DIM, None)


def test_hps_directory_of_symbolic_links_reads_the_same(tmp_path):
    real = write_hps(tmp_path / "real", np.arange(9), rows_of(9))
    os.makedirs(tmp_path / "t")
    for name in ("key", "emb_vector"):
        os.symlink(os.path.join(real, name), tmp_path / "t" / name)
    expect(tmp_path / "t", DIM, None)
    expect(str(tmp_path / "t") + "/", DIM, None)


@pytest.mark.parametrize("dim", [0, -3])
def test_a_dim_below_one_is_refused(tmp_path, dim):
    expect(write_hps(tmp_path / "t", np.arange(3), rows_of(3)), dim, "dim must be >= 1")


@pytest.mark.parametrize("dim", [1, 3, 5, 16, 1 << 61])
def test_wrong_dim_is_refused_with_the_dim_found(tmp_path, dim):
    expect(write_hps(tmp_path / "t", np.arange(10), np.zeros((10, 8))), dim, "floats per key")


@pytest.mark.parametrize(
    ("key_bytes", "vec_bytes", "words"),
    [
        (0, 16, "key is empty"),
        (8, 0, "emb_vector is empty"),
        (12, 16, "key has 12 bytes, not a whole number of 8-byte"),
        (8, 15, "emb_vector has 15 bytes, not a whole number of 4-byte"),
        (8, 12, "floats per key"),
    ],
)
def test_bad_sizes_are_refused(tmp_path, key_bytes, vec_bytes, words):
    path = tmp_path / "t"
    path.mkdir()
    (path / "key").write_bytes(b"\0" * key_bytes)
    (path / "emb_vector").write_bytes(b"\0" * vec_bytes)
    expect(path, DIM, words)


def test_missing_files_say_what_is_expected(tmp_path):
    expect(tmp_path / "nothing", DIM, "no table there")
    expect("", DIM, "no table there")
    (tmp_path / "half").mkdir()
    np.arange(3, dtype=np.int64).tofile(tmp_path / "half" / "key")
    expect(tmp_path / "half", DIM, "emb_vector is missing")
    (tmp_path / "half" / "emb_vector").mkdir()
    expect(tmp_path / "half", DIM, "emb_vector is missing")


# --- checkpoints without a manifest (NVIDIA SOK's layout) --------------------------------------------


@pytest.mark.parametrize(
    "keys",
    [
        np.array([2**64 - 1, 7, 2**63, 0], np.uint64),
        np.array([-1, 7, -(2**31), 2**31 - 1], np.int32),
        np.array([2**32 - 1, 7, 2**31, 0], np.uint32),
        KEYS,
        np.zeros(0, np.int64),
    ],
    ids=["uint64", "int32", "uint32", "int64", "empty"],
)
def test_nvidia_checkpoint_reads_the_same(tmp_path, keys):
    nvidia_checkpoint(tmp_path / "ck", keys, rows_of(len(keys)) if len(keys) else np.zeros(0, np.float32))
    expect(tmp_path / "ck" / "emb_0", DIM, None)
    expect(tmp_path / "ck" / "emb_0", 1, None if len(keys) == 0 else "but the ps_config gives dim 1")


def test_checkpoint_with_the_wrong_dim_is_refused(tmp_path):
    nvidia_checkpoint(tmp_path / "ck", np.arange(3, dtype=np.int64), np.zeros((3, 8), np.float32))
    expect(tmp_path / "ck" / "emb_0", DIM, "rows of 8 floats, but the ps_config gives dim 4")


@pytest.mark.parametrize(
    ("cwd", "path", "words"),
    [
        (".", "ck/emb_0/", None),
        (".", "ck//emb_0", None),
        (".", "ck/./emb_0", None),
        (".", "ck/x/../emb_0", None),
        (".", "./ck/emb_0", None),
        (".", "{abs}/ck/emb_0", None),
        (".", "/{abs}/ck/emb_0", None),
        (".", "emb_0", "no table there"),
        (".", "ck/emb_0/..", "no table there"),
        ("ck", "../ck/emb_0", None),
        ("ck", ".", "no table there"),
        ("ck", "emb_0", "no checkpoint directory at "),
        ("ck", "./emb_0", "no checkpoint directory at "),
    ],
)
def test_paths_written_in_other_ways(tmp_path, monkeypatch, cwd, path, words):
    nvidia_checkpoint(tmp_path / "ck", KEYS, rows_of(len(KEYS)))
    monkeypatch.chdir(tmp_path / cwd)
    expect(path.format(abs=tmp_path), DIM, words)


def header_with(file_type: int, dtype_index: int) -> bytes:
    return (
        fmt.header(fmt.FILE_KEY, "int64")[:256]
        + file_type.to_bytes(4, "big")
        + b" " * 32
        + dtype_index.to_bytes(4, "big")
    )


def key_header(dtype: str = "int64") -> bytes:
    return fmt.header(fmt.FILE_KEY, dtype)


def weight_header(dtype: str = "float32") -> bytes:
    return fmt.header(fmt.FILE_WEIGHT, dtype)


def write_files(path, key: bytes | None, weight: bytes | None) -> str:
    os.makedirs(path)
    for name, data in ((fmt.key_file("emb_0"), key), (fmt.weight_file("emb_0"), weight)):
        if data is not None:
            (path / name).write_bytes(data)
    return os.path.join(path, "emb_0")


GOOD_KEY = key_header() + np.arange(3, dtype=np.int64).tobytes()
GOOD_WEIGHT = weight_header() + rows_of(3).tobytes()


@pytest.mark.parametrize(
    ("key", "weight", "words"),
    [
        (b"\0" * 100, GOOD_WEIGHT, "shorter than the 296-byte header"),
        (GOOD_KEY, b"\0" * 295, "shorter than the 296-byte header"),
        (header_with(7, 1) + b"\0" * 8, GOOD_WEIGHT, "corrupt header (file type 7, dtype index 1)"),
        (GOOD_KEY, header_with(1, 9), "corrupt header (file type 1, dtype index 9)"),
        (key_header() + b"\0" * 12, GOOD_WEIGHT, "12 payload bytes is not a whole number of int64"),
        (GOOD_KEY, weight_header() + b"\0" * 6, "6 payload bytes is not a whole number of float32"),
        (fmt.header(fmt.FILE_WEIGHT, "int64") + b"\0" * 24, GOOD_WEIGHT, "have the wrong file types"),
        (GOOD_KEY, fmt.header(fmt.FILE_STATE, "float32") + b"\0" * 48, "have the wrong file types"),
        (key_header("float32") + b"\0" * 12, GOOD_WEIGHT, "keys are float32 and weights float32"),
        (GOOD_KEY, weight_header("float64") + b"\0" * 96, "keys are int64 and weights float64"),
        (GOOD_KEY, weight_header() + b"\0" * 40, "holds 10 floats, not a whole number of rows for the 3 keys"),
        (key_header(), weight_header() + b"\0" * 16, "holds 4 floats, not a whole number of rows for the 0 keys"),
        (GOOD_KEY, None, "emb_0-weight is missing"),
        (None, GOOD_WEIGHT, "no table there"),
    ],
)
def test_bad_checkpoint_files_are_refused(tmp_path, key, weight, words):
    expect(write_files(tmp_path / "ck", key, weight), DIM, words)


@pytest.mark.parametrize("which", ["key", "weight"])
@pytest.mark.parametrize("kind", ["symlink", "directory", "fifo"])
def test_files_that_are_not_regular_are_refused(tmp_path, which, kind):
    path = write_files(tmp_path / "ck", GOOD_KEY, GOOD_WEIGHT)
    (tmp_path / "real").write_bytes(GOOD_KEY if which == "key" else GOOD_WEIGHT)
    file = tmp_path / "ck" / f"emb_0-{which}"
    file.unlink()
    if kind == "symlink":
        os.symlink(tmp_path / "real", file)
    elif kind == "directory":
        file.mkdir()
    else:
        os.mkfifo(file)
    words = "no table there" if which == "key" and kind != "symlink" else "is not a regular file"
    if which == "weight" and kind == "directory":
        words = "[Errno 21] Is a directory"  # os.fdopen's refusal, before format.open_file's check
    expect(path, DIM, words)


# --- checkpoints with a manifest ---------------------------------------------------------------------


def test_checkpoint_with_a_manifest_reads_the_same(tmp_path):
    expect(checkpoint(tmp_path / "a"), DIM, None)
    expect(checkpoint(tmp_path / "b", keys=np.array([3, 1], np.uint32)), DIM, None)
    expect(checkpoint(tmp_path / "c", keys=np.zeros(0, np.int64), rows=np.zeros((0, 7), np.float32)), DIM, None)


@pytest.mark.parametrize("flipped", [None, -1, fmt.HEADER_BYTES + 13])
def test_checksums_of_files_of_lengths_that_are_no_multiple_of_8(tmp_path, flipped):
    """3 int32 keys and rows of 3 floats: files and chunks whose lengths leave the CRC-32's last
    bytes to its byte-wise tail (a flipped byte there is found as well)."""
    path = checkpoint(tmp_path / "ck", keys=np.array([-4, 9, 2**31 - 1], np.int32), rows=rows_of(3, 3))
    if flipped is not None:
        flip(tmp_path / "ck" / "emb_0-weight", flipped, 0x20)
    expect(path, 3, None)
    flip(tmp_path / "ck" / "emb_0-key", -1, 0x02)
    expect(path, 3, "emb_0-key does not match its checksum in the manifest")


def setter(name, value, *, entry=False):
    def edit(manifest, table):
        (table if entry else manifest)[name] = value

    return edit


def deleter(name, *, entry=False):
    def edit(manifest, table):
        del (table if entry else manifest)[name]

    return edit


def crc_edit(file: str, value):
    def edit(manifest, table):
        if value is None:
            del table["crc32"][file]
        else:
            table["crc32"][file] = value

    return edit


def add_table(name: str, value=None):
    def edit(manifest, table):
        manifest["tables"][name] = dict(table) if value is None else value

    return edit


def renamed(manifest, table):
    manifest["tables"] = {"zz": table, "aa": dict(table), "it's": dict(table)}


REPR_VALUES = {
    "floats": [1.5, 1e16, 1e15, 1e-05, 0.0001, -0.0, 0.1, 1e308 * 10, -1e308 * 10, float("nan"), 123456789.25, 5e-324],
    "ints": [0, -1, 2**63 - 1, -(2**63)],
    "strings": [
        "it's",
        'say "hi"',
        "both ' \"",
        "tab\t\n\r\\",
        "\x00\x1f\x7f\x80\x9f\xa0\xad\xe9",
        "\u2028\u200b\ud800",
    ],
    "more": ["\U0001f600\U000e0001\U000f0000\u3000\ufeff", {"nested": [None, True, False, {}, []]}],
}

MANIFEST_EDITS = {
    "format_version 2": (setter("format_version", 2), "has format version 2"),
    "format_version missing": (deleter("format_version"), "has format version None"),
    "format_version '1'": (setter("format_version", "1"), "has format version '1'"),
    "format_version true": (setter("format_version", True), None),
    "format_version 1.0": (setter("format_version", 1.0), None),
    "world_size 0": (setter("world_size", 0), "field world_size is 0"),
    "world_size true": (setter("world_size", True), "field world_size is True"),
    "world_size null": (setter("world_size", None), "field world_size is None"),
    "world_size values": (setter("world_size", REPR_VALUES), "field world_size is {"),
    "optimizer 5": (setter("optimizer", 5), "field optimizer is 5"),
    "step -1": (setter("step", -1), "field step is -1"),
    "step 1.5": (setter("step", 1.5), "field step is 1.5"),
    "optimizer_step false": (setter("optimizer_step", False), "field optimizer_step is False"),
    "tables missing": (deleter("tables"), "field tables is None"),
    "tables list": (setter("tables", [1, "x"]), "field tables is [1, 'x']"),
    "table ''": (add_table(""), "table '' is refused: it is empty"),
    "table '.'": (add_table("."), "it is '.' or '..'"),
    "table '..'": (add_table(".."), "it is '.' or '..'"),
    "table 'a/b'": (add_table("a/b"), "it contains a path separator"),
    "table NUL": (add_table("a\0b"), "it contains a NUL character"),
    "table entry list": (add_table("other", [1]), "field tables.other is [1]"),
    "entry not listed": (renamed, "does not list table 'emb_0'"),
    "variable 5": (setter("variable", 5, entry=True), "tables.emb_0.variable is 5"),
    "dim 0": (setter("dim", 0, entry=True), "tables.emb_0.dim is 0"),
    "dim '4'": (setter("dim", "4", entry=True), "tables.emb_0.dim is '4'"),
    "dim 4.0": (setter("dim", 4.0, entry=True), "tables.emb_0.dim is 4.0"),
    "rows -1": (setter("rows", -1, entry=True), "tables.emb_0.rows is -1"),
    "key_dtype 64": (setter("key_dtype", 64, entry=True), "tables.emb_0.key_dtype is 64"),
    "key_dtype float32": (setter("key_dtype", "float32", entry=True), "expected one of int32, int64"),
    "dtype int8": (setter("dtype", "int8", entry=True), "expected one of float32, float16, bfloat16"),
    "dtype 16": (setter("dtype", 16, entry=True), "tables.emb_0.dtype is 16"),
    "dtype bfloat16": (setter("dtype", "bfloat16", entry=True), None),
    "slots 'x'": (setter("slots", "x", entry=True), "tables.emb_0.slots is 'x'"),
    "slots ['']": (setter("slots", [""], entry=True), "tables.emb_0.slots is ['']"),
    "slots [1, 'a']": (setter("slots", [1, "a"], entry=True), "tables.emb_0.slots is [1, 'a']"),
    "kind x": (setter("kind", "x", entry=True), 'expected "dynamic" or "static"'),
    "kind 1": (setter("kind", 1, entry=True), "tables.emb_0.kind is 1"),
    "mode 3": (setter("mode", 3, entry=True), "tables.emb_0.mode is 3"),
    "mode null": (setter("mode", None, entry=True), None),
    "crc32 list": (setter("crc32", [], entry=True), "tables.emb_0.crc32 is []"),
    "unknown field": (setter("colour", "blue", entry=True), None),
    "dim missing": (deleter("dim", entry=True), "table emb_0 lacks the field 'dim'"),
    "rows missing": (deleter("rows", entry=True), "lacks the field 'rows'"),
    "key_dtype missing": (deleter("key_dtype", entry=True), "lacks the field 'key_dtype'"),
    "slots missing": (deleter("slots", entry=True), "lacks the field 'slots'"),
    "crc32 file ''": (crc_edit("", "00000000"), "tables.emb_0.crc32 file '' is refused"),
    "crc32 file '..'": (crc_edit("..", "00000000"), "tables.emb_0.crc32 file '..' is refused"),
    "crc32 file 'a/b'": (crc_edit("a/b", "00000000"), "it contains a path separator"),
    "crc32 digest int": (crc_edit("emb_0-key", 12345678), "tables.emb_0.crc32.emb_0-key is 12345678"),
    "crc32 digest short": (crc_edit("emb_0-key", "1234567"), "is '1234567'; expected 8 hex digits"),
    "crc32 digest long": (crc_edit("emb_0-key", "123456789"), "is '123456789'; expected 8 hex digits"),
    "crc32 digest not hex": (crc_edit("emb_0-key", "1234567g"), "is '1234567g'; expected 8 hex digits"),
    "crc32 digest not ascii": (crc_edit("emb_0-key", "1234567\u0661"), "expected 8 hex digits"),
    "key crc32 wrong": (crc_edit("emb_0-key", "00000000"), "emb_0-key does not match its checksum in the manifest"),
    "key crc32 upper case": (crc_edit("emb_0-key", "ABCDEF12"), "expected ABCDEF12): the file is corrupt"),
    "key crc32 missing": (crc_edit("emb_0-key", None), "has no checksum for"),
    "weight crc32 missing": (crc_edit("emb_0-weight", None), "has no checksum for"),
    "weight crc32 wrong": (crc_edit("emb_0-weight", "00000000"), None),
    "rows differ": (setter("rows", 5, entry=True), "says table 'emb_0' has rows 5 but its files have 6"),
    "dim differs": (setter("dim", 3, entry=True), "says table 'emb_0' has dim 3 but its files have 4"),
    "key_dtype differs": (
        setter("key_dtype", "uint64", entry=True),
        "has key_dtype 'uint64' but its files have 'int64'",
    ),
}


@pytest.mark.parametrize("case", list(MANIFEST_EDITS))
def test_manifest_fields_are_checked_the_same(tmp_path, case):
    edit, words = MANIFEST_EDITS[case]
    expect(checkpoint(tmp_path / "ck", edit=edit), DIM, words)


def test_a_weight_file_that_fails_its_checksum_fails_both_the_same(tmp_path):
    path = checkpoint(tmp_path / "ck", edit=crc_edit("emb_0-weight", "00000000"))
    (_, py_error), (_, cpp_error) = (
        outcome(mf.open_table(path, DIM).verify),
        outcome(_serving.open_table(path, DIM).verify),
    )
    assert "the weight file does not match the checkpoint's checksum" in str(py_error)
    assert_same_error(py_error, cpp_error)


def test_every_printable_and_escaped_character_is_written_as_repr_writes_it(tmp_path):
    """Every code point (surrogates and unassigned ones included) in one value of a refused field."""
    chars = "".join(chr(c) for c in range(0x110000))
    expect(checkpoint(tmp_path / "ck", edit=setter("optimizer", [chars])), DIM, "field optimizer is ['")


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"{",
        b'{"format_version": 1,}',
        b"\xef\xbb\xbf{}",
        b"[1, 2]",
        b"null",
        b"3",
        b"1.5",
        b"true",
        b'"x"',
        b"{}",
        b"\x80",
        b"\xff{}",
        b"\xc0\xaf",
        b"\xc2",
        b'{"a": "\xe2\x82"}',
        b"\xe2\x82A",
        b"\xe0\x80\x80",
        b"\xe0\xa0",
        b"\xed\xa0\x80",
        b"\xf0\x80\x80\x80",
        b"\xf0\x9f\x98",
        b"\xf0\x9f\x98A",
        b"\xf0\x9fA",
        b"\xf4\x90\x80\x80",
        b"\xf5\x80",
        b'{"format_version": 1, "tables": {}} x',
        b'{"format_version": 1, "tables": {"emb_0": {"dim": 99999999999999999999}}}',
    ],
)
def test_manifest_bytes_are_parsed_the_same(tmp_path, raw):
    path = checkpoint(tmp_path / "ck", raw=raw)
    if b"99999999999999999999" in raw:  # json.hpp: an integer beyond int64 is a parse error
        py_error = outcome(lambda: mf.open_table(path, DIM))[1]
        cpp_error = outcome(lambda: _serving.open_table(path, DIM))[1]
        assert "lacks the field 'rows'" in str(py_error)
        assert "integer 99999999999999999999 does not fit 64 bits" in str(cpp_error)
        return
    expect(path, DIM, "manifest")


def test_random_manifest_bytes_are_parsed_the_same(tmp_path):
    """Random bytes from a mix of JSON, UTF-8 sequences and bytes that are not UTF-8."""
    path = checkpoint(tmp_path / "ck")
    good = json.dumps(json.loads(open(os.path.join(tmp_path, "ck", fmt.MANIFEST), "rb").read())).encode()
    pieces = [b"{", b"}", b"[", b"]", b'"', b":", b",", b"1", b"-", b"e", b"\\u", b"d800", b" ", b"\n"]
    pieces += [b"\x80", b"\xc3", b"\xa9", b"\xe2\x82", b"\xac", b"\xed", b"\xa0", b"\xf0\x9f", b"\xff", b"\xf4\x90"]
    rng = np.random.default_rng(7)
    for _ in range(300):
        chosen = [pieces[i] for i in rng.integers(0, len(pieces), rng.integers(1, 12))]
        raw = b"".join(chosen) if rng.random() < 0.5 else good[: rng.integers(0, len(good))] + b"".join(chosen)
        with open(os.path.join(tmp_path, "ck", fmt.MANIFEST), "wb") as f:
            f.write(raw)
        assert assert_same(path, DIM) is not None


@pytest.mark.parametrize("kind", ["symlink", "directory"])
def test_a_manifest_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    path = checkpoint(tmp_path / "ck")
    manifest = tmp_path / "ck" / fmt.MANIFEST
    os.replace(manifest, tmp_path / "elsewhere.json")
    if kind == "symlink":
        os.symlink(tmp_path / "elsewhere.json", manifest)
    else:
        manifest.mkdir()
    expect(path, DIM, "is not a regular file" if kind == "symlink" else "(UTF-8 JSON): [Errno 21] Is a directory")


NAMES = ["tabl\u00e9", "it's", 'say "x"', "tab\tx", "\u65e5\u672c", os.fsdecode(b"t\xff\x80"), "\ue000", "zz"]


@pytest.mark.parametrize("table", NAMES)
def test_table_names_of_any_characters_read_and_are_written_as_python_writes_them(tmp_path, table):
    """Names with quotes, controls, letters of other scripts and bytes that are not UTF-8 (the
    manifest names those as os.fsdecode reads them, with lone surrogates): found in the manifest as
    Python finds them, written in messages (repr, the listed tables sorted) as Python writes them."""
    expect(checkpoint(tmp_path / "ck", table=table), DIM, None)

    def others(manifest, entry):
        manifest["tables"] = {name: dict(entry) for name in NAMES if name != table}

    expect(checkpoint(tmp_path / "other", table=table, edit=others), DIM, "does not list table")

    def bad_dim(manifest, entry):
        entry["dim"] = 0

    expect(checkpoint(tmp_path / "bad", table=table, edit=bad_dim), DIM, ".dim is 0")


@pytest.mark.parametrize("marked", [False, True])
@pytest.mark.parametrize("with_manifest", [False, True])
def test_staging_directories_are_refused(tmp_path, marked, with_manifest):
    name = "ck" if marked else f".ck{ckdir.STAGING_INFIX}x1y2"
    path = checkpoint(tmp_path / name)
    if marked:
        (tmp_path / name / ckdir.STAGING_MARK).write_text("incomplete")
    if not with_manifest:
        (tmp_path / name / fmt.MANIFEST).unlink()
    expect(path, DIM, "is the staging directory of a sok.dump")


def test_a_checkpoint_swapped_while_it_is_read_reads_whole_as_one_or_the_other(tmp_path):
    """Another thread exchanges the checkpoint with another one again and again (as sok.dump swaps a
    new one in): every open reads one of the two whole (its files opened relative to the directory
    opened once), never the key file of one and the weight file or manifest of the other."""
    tables = {}
    for name, first in (("ck", 0), ("other", 100)):
        keys = np.arange(first, first + 500, dtype=np.int64)
        checkpoint(tmp_path / name, keys=keys, rows=rows_of(500) + first)
        tables[first] = rows_of(500) + first
    if not ckdir._exchange(str(tmp_path / "ck"), str(tmp_path / "other")):
        pytest.skip("this file system cannot exchange two directories (renameat2 RENAME_EXCHANGE)")
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            ckdir._exchange(str(tmp_path / "ck"), str(tmp_path / "other"))

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        for _ in range(3000):
            table = _serving.open_table(tmp_path / "ck" / "emb_0", DIM)
            table.verify()
            (keys, rows), *rest = list(table.chunks(1 << 20))
            assert not rest and len(keys) == 500
            np.testing.assert_array_equal(keys, np.arange(keys[0], keys[0] + 500))
            assert rows.tobytes() == tables[int(keys[0])].tobytes()
    finally:
        stop.set()
        swapper.join()


@pytest.mark.parametrize("reader", ["python", "cpp"])
def test_a_checkpoint_missing_between_the_renames_of_a_swap_is_read_again(tmp_path, reader):
    """Another thread renames the checkpoint aside as a staging directory and back again and again
    (the two renames of a swap where the file system cannot exchange): a read that finds the table
    (model_files's first check) and then the directory missing, with the staging directory beside
    it, waits and reads again: it never reports that staging directories lie beside it. It may still
    find no directory (mirrored from directory.py: at its last attempt, or back already when it looks
    for leftovers)."""
    path = checkpoint(tmp_path / "ck")
    aside = tmp_path / f".ck{ckdir.STAGING_INFIX}x1y2"
    open_table = mf.open_table if reader == "python" else _serving.open_table
    stop = threading.Event()

    def swap():
        while not stop.is_set():
            os.rename(tmp_path / "ck", aside)
            time.sleep(0.0002)
            os.rename(aside, tmp_path / "ck")
            time.sleep(0.002)

    swapper = threading.Thread(target=swap)
    swapper.start()
    try:
        read = 0
        for _ in range(6000):
            table, error = outcome(lambda: open_table(path, DIM))
            if error is None:
                np.testing.assert_array_equal(table.keys, KEYS)
                read += 1
            else:
                missing = f"{path}: no checkpoint directory at {tmp_path / 'ck'}"
                assert "no table there" in str(error) or str(error).startswith(missing), error
                assert "staging directories lie beside it" not in str(error), error
    finally:
        stop.set()
        swapper.join()
    assert read > 0


def test_the_directory_of_a_relative_table_name_is_the_current_one(tmp_path, monkeypatch):
    checkpoint(tmp_path / "ck")
    monkeypatch.chdir(tmp_path / "ck")
    expect("emb_0", DIM, "no checkpoint directory at ")


# --- sok.dump of real tables -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def dumped(tmp_path_factory):
    """A sok.dump of a DynamicVariable trained a step (test_model_files.sok_dump) and one of
    sok.Variable tables of float32, float16 and bfloat16 rows: (dynamic dir, static dir, {table:
    the variable's rows widened to float32})."""
    tf = pytest.importorskip("tensorflow")
    import sparse_operation_kit as sok

    dynamic = tmp_path_factory.mktemp("dynamic") / "ck"
    sok_dump(dynamic)
    static = tmp_path_factory.mktemp("static") / "ck"
    values = np.random.default_rng(3).standard_normal((40, DIM)).astype(np.float32)
    tables = [sok.Variable(values, dtype=d, name=f"rows_{d}") for d in dtypes.STATIC_ROW_DTYPES]
    sok.dump(str(static), tables)
    widened = {fmt.table_name(t.name): tf.cast(tf.convert_to_tensor(t), tf.float32).numpy() for t in tables}
    return dynamic, static, widened


def test_sok_dump_of_a_dynamic_variable_reads_the_same(dumped):
    dynamic, _, _ = dumped
    expect(dynamic / "dyn_0", DIM, None)


def test_sok_dump_of_static_tables_reads_the_same_widened_rows(dumped):
    _, static, widened = dumped
    manifest = json.loads((static / fmt.MANIFEST).read_text())
    assert sorted(e["dtype"] for e in manifest["tables"].values()) == sorted(dtypes.STATIC_ROW_DTYPES)
    assert sorted(manifest["tables"]) == sorted(widened)
    for table, rows in widened.items():
        expect(static / table, DIM, None)
        got = _serving.open_table(static / table, DIM)
        (keys, chunk), *_ = list(got.chunks(1 << 20))
        np.testing.assert_array_equal(chunk, rows[keys])  # keys: global row ids


@pytest.fixture
def dumped_copy(dumped, tmp_path):
    import shutil

    shutil.copytree(dumped[0], tmp_path / "ck")
    return tmp_path / "ck"


def flip(path, offset: int, bit: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))


def test_sok_dump_corrupt_weights_fail_the_checksum_the_same(dumped_copy):
    flip(dumped_copy / "dyn_0-weight", -1, 0x40)
    expect(dumped_copy / "dyn_0", DIM, None)  # opens; verify() and the chunks fail the same
    flip(dumped_copy / "dyn_0-weight", fmt.HEADER_BYTES, 0x01)
    assert "does not match the checkpoint's checksum" in str(
        outcome(_serving.open_table(dumped_copy / "dyn_0", DIM).verify)[1]
    )


def test_sok_dump_corrupt_keys_fail_the_checksum_at_open(dumped_copy):
    flip(dumped_copy / "dyn_0-key", fmt.HEADER_BYTES + 3, 0x10)
    expect(dumped_copy / "dyn_0", DIM, "dyn_0-key does not match its checksum in the manifest")


def test_sok_dump_truncated_weights_are_refused_at_open(dumped_copy):
    weight = dumped_copy / "dyn_0-weight"
    os.truncate(weight, os.path.getsize(weight) - 4 * DIM)
    expect(dumped_copy / "dyn_0", DIM, "dyn_0-weight")


# --- constants -----------------------------------------------------------------------------------------


def test_the_cpp_constants_mirror_the_python_ones():
    python = {
        "format.HEADER_BYTES": fmt.HEADER_BYTES,
        "format.FILE_KEY": fmt.FILE_KEY,
        "format.FILE_WEIGHT": fmt.FILE_WEIGHT,
        "format.FILE_STATE": fmt.FILE_STATE,
        "format.INDEX_DTYPE": fmt.INDEX_DTYPE,
        "format.INDEX_DTYPE itemsize": {i: np.dtype(d).itemsize for i, d in fmt.INDEX_DTYPE.items()},
        "format.KEY_FILE_DTYPES": tuple(fmt.KEY_FILE_DTYPES),
        "format.key_file('t')": fmt.key_file("t"),
        "format.weight_file('t')": fmt.weight_file("t"),
        "format.FORMAT_VERSION": fmt.FORMAT_VERSION,
        "format.MANIFEST": fmt.MANIFEST,
        "format.TABLE_KINDS": tuple(fmt.TABLE_KINDS),
        "dtypes.STATIC_ROW_DTYPES": tuple(dtypes.STATIC_ROW_DTYPES),
        "directory.READ_ATTEMPTS": ckdir.READ_ATTEMPTS,
        "directory.STAGING_MARK": ckdir.STAGING_MARK,
        "directory.STAGING_INFIX": ckdir.STAGING_INFIX,
        "directory.LOCK_SUFFIX": ckdir.LOCK_SUFFIX,
        "directory._LOCK_POLL_S": ckdir._LOCK_POLL_S,
        "directory._LOCK_POLL_MAX_S": ckdir._LOCK_POLL_MAX_S,
        "model_files.KEY_FILE": mf.KEY_FILE,
        "model_files.VECTOR_FILE": mf.VECTOR_FILE,
    }
    assert dict(_serving.MIRRORED_CONSTANTS) == python


def test_chunk_rows_below_one_are_refused_the_same(tmp_path):
    path = write_hps(tmp_path / "t", np.arange(3), rows_of(3))
    for table in (mf.open_table(path, DIM), _serving.open_table(path, DIM)):
        with pytest.raises(ValueError, match="^chunk_rows must be >= 1, got 0$"):
            next(iter(table.chunks(0)))
