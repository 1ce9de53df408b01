"""The checkpoint format's schema and ``sok ckpt inspect``, without TensorFlow.

* ``manifest.json`` is ``checkpoint.format.Manifest``'s JSON: a manifest as sok.dump writes it
  reads back and writes out byte for byte, under today's field names; an older manifest without the
  optional fields still reads.
* ``sok ckpt inspect`` (and ``sok ckpt convert``'s import) never imports TensorFlow, and inspect
  never renames, deletes or writes: an interrupted dump's leftovers are reported as found.
* ``sok ckpt convert`` without sok-hps names the extra to install.

The checkpoints here are written with checkpoint.format alone; sok.dump's own manifests are checked
against the schema in test_checkpoint.py.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt
from sparse_operation_kit.checkpoint.inspect import inspect as ckpt_inspect
from sparse_operation_kit.cli import main as cli_main

#: manifest.json as sok.dump wrote it before the schema moved into checkpoint.format (a trained
#: DynamicVariable with Adagrad state and an untrained sok.Variable): the bytes stay the same.
TODAYS_MANIFEST = """{
  "format_version": 1,
  "optimizer": "Adagrad",
  "optimizer_step": 0,
  "step": 1,
  "tables": {
    "dyn_0": {
      "crc32": {
        "dyn_0-Adagrad-accumulator": "ff224cc6",
        "dyn_0-key": "fc11b5d4",
        "dyn_0-weight": "8e52d93c"
      },
      "dim": 4,
      "dtype": "float32",
      "key_dtype": "int64",
      "kind": "dynamic",
      "mode": null,
      "rows": 8,
      "slots": [
        "accumulator"
      ],
      "variable": "dyn:0"
    },
    "static_0": {
      "crc32": {
        "static_0-key": "98d8cfb9",
        "static_0-weight": "04cb39e9"
      },
      "dim": 4,
      "dtype": "float32",
      "key_dtype": "int64",
      "kind": "static",
      "mode": "distributed",
      "rows": 10,
      "slots": [],
      "variable": "static:0"
    }
  },
  "world_size": 1
}"""
MANIFEST_FIELDS = {"format_version", "world_size", "optimizer", "step", "optimizer_step", "tables"}
TABLE_FIELDS = {"variable", "dim", "rows", "key_dtype", "dtype", "slots", "kind", "mode", "crc32"}
DIM = 4


# -- the schema -------------------------------------------------------------------------------------
def test_todays_manifest_round_trips_byte_for_byte(tmp_path):
    manifest = fmt.Manifest.from_json(TODAYS_MANIFEST.encode(), "manifest.json")
    assert manifest.to_json() == TODAYS_MANIFEST
    fmt.write_manifest(str(tmp_path), manifest)
    assert (tmp_path / fmt.MANIFEST).read_bytes() == TODAYS_MANIFEST.encode()
    assert fmt.read_manifest(str(tmp_path)) == manifest


def test_manifest_keeps_todays_field_names():
    data = json.loads(TODAYS_MANIFEST)
    manifest = fmt.Manifest.from_dict(data, "manifest.json")
    assert set(manifest.to_dict()) == set(data) == MANIFEST_FIELDS
    for name, entry in manifest.tables.items():
        assert set(entry.to_dict()) == set(data["tables"][name]) == TABLE_FIELDS
    assert manifest.format_version == fmt.FORMAT_VERSION
    assert manifest.tables["dyn_0"] == fmt.TableEntry(
        variable="dyn:0",
        dim=4,
        rows=8,
        key_dtype="int64",
        slots=["accumulator"],
        kind="dynamic",
        mode=None,
        crc32={"dyn_0-Adagrad-accumulator": "ff224cc6", "dyn_0-key": "fc11b5d4", "dyn_0-weight": "8e52d93c"},
    )


def test_manifest_without_the_optional_fields_reads_with_their_defaults():
    data = {"format_version": 1, "tables": {"emb_0": {"dim": 4, "rows": 2, "key_dtype": "uint64", "slots": []}}}
    manifest = fmt.Manifest.from_dict(data, "manifest.json")
    assert (manifest.world_size, manifest.optimizer, manifest.step, manifest.optimizer_step) == (None,) * 4
    entry = manifest.tables["emb_0"]
    assert (entry.variable, entry.dtype, entry.kind, entry.mode, entry.crc32) == (None, "float32", "dynamic", None, {})
    assert "world_size" not in manifest.to_dict() and "variable" not in entry.to_dict()


def test_manifest_of_another_format_version_names_the_fix():
    data = json.loads(TODAYS_MANIFEST) | {"format_version": fmt.FORMAT_VERSION + 1}
    with pytest.raises(fmt.CheckpointError, match=r"format version 2; this sok-core reads version 1: upgrade"):
        fmt.Manifest.from_dict(data, "manifest.json")


# -- checkpoints written with checkpoint.format alone ----------------------------------------------
def write_table(path: str, table: str, keys: np.ndarray, rows: np.ndarray) -> fmt.TableEntry:
    """A table's key and weight files, and its manifest entry with their checksums."""
    names = [fmt.key_file(table), fmt.weight_file(table)]
    heads = [fmt.header(fmt.FILE_KEY, keys.dtype.name), fmt.header(fmt.FILE_WEIGHT, "float32")]
    for name, head, data in zip(names, heads, [keys, rows.astype(np.float32)]):
        with open(os.path.join(path, name), "wb") as f:
            f.write(head + data.tobytes())
    crc32 = {name: fmt.crc32(os.path.join(path, name)) for name in names}
    return fmt.TableEntry(dim=rows.shape[1], rows=len(keys), key_dtype=keys.dtype.name, slots=[], crc32=crc32)


def write_checkpoint(path: str, marker: bool = False) -> None:
    """A two-table checkpoint at ``path``; with ``marker``, a dump's unfinished staging directory."""
    os.makedirs(path)
    if marker:
        with open(os.path.join(path, ckdir.STAGING_MARK), "w") as f:
            f.write("incomplete sok.dump\n")
    rows = np.arange(5 * DIM, dtype=np.float32).reshape(5, DIM)
    tables = {
        "a_0": write_table(path, "a_0", np.array([3, 1, 4, 15, 9], np.int64), rows),
        "b_0": write_table(path, "b_0", np.array([2**64 - 1, 0], np.uint64), rows[:2]),
    }
    if not marker:
        fmt.write_manifest(path, fmt.Manifest(tables=tables, world_size=1))


def snapshot(root) -> dict[str, tuple]:
    """Every entry under ``root``: kind, mode, mtime (ns) and, for a file, its bytes."""
    out = {}
    for parent, dirs, files in os.walk(root):
        for name in dirs + files:
            full = os.path.join(parent, name)
            st = os.lstat(full)
            data = None
            if name in files:
                with open(full, "rb") as f:
                    data = f.read()
            out[os.path.relpath(full, root)] = (st.st_mode, st.st_mtime_ns, data)
    st = os.lstat(root)
    out["."] = (st.st_mode, st.st_mtime_ns, None)
    return out


def run_without_tensorflow(argv: list[str]) -> subprocess.CompletedProcess:
    """``sok <argv>`` in a fresh interpreter that fails when TensorFlow was imported."""
    code = (
        "import sys\n"
        "from sparse_operation_kit.cli import main\n"
        f"rc = main({argv!r})\n"
        "loaded = sorted(m for m in sys.modules if m == 'tensorflow' or m.startswith('tensorflow.'))\n"
        "print('tensorflow modules imported:', loaded, file=sys.stderr)\n"
        "sys.exit(rc if not loaded else 99)\n"
    )
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)


def test_cli_inspect_imports_no_tensorflow(tmp_path):
    path = str(tmp_path / "ck")
    write_checkpoint(path)
    result = run_without_tensorflow(["ckpt", "inspect", path])
    assert result.returncode == 0, result.stderr
    assert "tensorflow modules imported: []" in result.stderr
    assert "a_0: 5 rows x 4 (int64 keys)" in result.stdout and "b_0: 2 rows x 4 (uint64 keys)" in result.stdout
    assert "checksums: verified" in result.stdout


def test_cli_inspect_of_a_checkpoint_a_dump_left_missing_reports_it_and_changes_nothing(tmp_path, capsys):
    """A dump killed between its two renames leaves no checkpoint at the path and both checkpoints
    beside it: inspect names them (the complete one to rename) and moves, deletes, writes nothing."""
    path = str(tmp_path / "ck")
    write_checkpoint(os.path.join(tmp_path, ".ck.sok-tmp-abc123.old"))  # the previous checkpoint, set aside
    write_checkpoint(os.path.join(tmp_path, ".ck.sok-tmp-def456"), marker=True)  # a staging directory
    before = snapshot(tmp_path)
    assert cli_main(["ckpt", "inspect", path]) == 2
    err = capsys.readouterr().err
    assert f"no checkpoint directory at {path}; interrupted dumps of it left" in err
    assert f".ck.sok-tmp-abc123.old holds a complete checkpoint: rename it to {path} to load it" in err
    with pytest.raises(fmt.CheckpointError, match="no checkpoint directory"):
        ckpt_inspect(path)
    assert snapshot(tmp_path) == before


def test_cli_inspect_reports_leftovers_beside_a_checkpoint_and_changes_nothing(tmp_path, capsys):
    path = str(tmp_path / "ck")
    write_checkpoint(path)
    staging = os.path.join(tmp_path, ".ck.sok-tmp-def456")
    write_checkpoint(staging, marker=True)
    before = snapshot(tmp_path)
    assert cli_main(["ckpt", "inspect", path, "--json"]) == 0
    out = capsys.readouterr().out
    assert f"left beside it by an interrupted (or running) sok.dump: {staging} (incomplete)" in out
    assert "the next sok.dump of it deletes them" in out
    assert json.loads(out[out.index("{") :])["leftovers"] == [{"path": staging, "complete": False}]
    assert cli_main(["ckpt", "inspect", staging]) == 2
    assert "staging directory of a sok.dump that did not finish" in capsys.readouterr().err
    assert snapshot(tmp_path) == before


def without_command_plugins(monkeypatch) -> None:
    """The ``sok`` command as without sok-hps: no plugin of the entry-point group ``sok.commands``."""
    import pluggy
    from sparse_operation_kit.plugins import commands, hookspecs

    def bare() -> pluggy.PluginManager:
        manager = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        manager.add_hookspecs(hookspecs)
        return manager

    monkeypatch.setattr(commands, "plugin_manager", bare)


def test_cli_convert_without_sok_hps_names_the_extra_to_install(tmp_path, monkeypatch, capsys):
    path = str(tmp_path / "ck")
    write_checkpoint(path)
    without_command_plugins(monkeypatch)
    assert cli_main(["ckpt", "convert", path, str(tmp_path / "hps")]) == 2
    err = capsys.readouterr().err
    assert "sok ckpt convert needs sok-hps (pip install 'sok-core[hps]'), which is not installed" in err
    assert not os.path.exists(tmp_path / "hps")


def test_cli_convert_comes_from_sok_hps_through_the_commands_entry_point():
    # sok-core holds no convert of its own: with sok-hps installed its plugin adds the subcommand.
    pytest.importorskip("hierarchical_parameter_server")
    from sparse_operation_kit.cli import build_parser
    from sparse_operation_kit.plugins.commands import plugin_manager

    names = [name for name, _ in plugin_manager().list_name_plugin()]
    assert "hps" in names
    args = build_parser().parse_args(["ckpt", "convert", "a", "b"])
    assert args.run.__module__ == "hierarchical_parameter_server.sok_commands"


# -- names stay inside the checkpoint ---------------------------------------------------------------
#: Paths opened by this process while a test records them (an audit hook sees every open, os.open too).
_opened: list[str] | None = None


def _record_opens(event: str, args: tuple) -> None:
    if event == "open" and _opened is not None and isinstance(args[0], (str, bytes)):
        _opened.append(os.fsdecode(args[0]))


sys.addaudithook(_record_opens)


@pytest.fixture
def opened() -> list[str]:
    """The paths this process opens during the test (relative ones as given, e.g. to a directory fd)."""
    global _opened
    _opened = []
    try:
        yield _opened
    finally:
        _opened = None


BAD_NAMES = {
    "parent": ("..", r"it is '\.' or '\.\.'"),
    "dot": (".", r"it is '\.' or '\.\.'"),
    "outside": ("../../x", r"it contains a path separator"),
    "absolute": ("/etc/passwd", r"it contains a path separator"),
    "nul": ("a\0b", r"it contains a NUL character"),
    "empty": ("", r"it is empty"),
}


@pytest.mark.parametrize("case", BAD_NAMES)
def test_check_name_refuses_names_that_leave_their_directory(case):
    name, rule = BAD_NAMES[case]
    with pytest.raises(fmt.CheckpointError, match=rf"table {re.escape(repr(name))} is refused: {rule}"):
        fmt.check_name(name, "table")
    assert fmt.check_name("emb_0-key", "file") == "emb_0-key"


@pytest.mark.parametrize("where", ["table", "checksum"])
def test_manifest_naming_entries_outside_the_checkpoint_is_refused(where):
    data = json.loads(TODAYS_MANIFEST)
    if where == "table":
        data["tables"][".."] = data["tables"].pop("dyn_0")
        match = r"manifest.json: table '\.\.' is refused: it is '\.' or '\.\.'"
    else:
        data["tables"]["dyn_0"]["crc32"]["../../x"] = "00000000"
        match = r"manifest.json: tables.dyn_0.crc32 file '\.\./\.\./x' is refused: it contains a path separator"
    with pytest.raises(fmt.CheckpointError, match=match):
        fmt.Manifest.from_dict(data, "manifest.json")


def test_inspect_never_reads_a_file_the_manifest_names_outside_the_checkpoint(tmp_path, opened):
    path = str(tmp_path / "deep" / "ck")
    os.makedirs(os.path.dirname(path))
    write_checkpoint(path)
    outside = tmp_path / "x"  # path/../../x
    outside.write_bytes(b"not part of the checkpoint")
    manifest = json.loads((tmp_path / "deep" / "ck" / fmt.MANIFEST).read_text())
    manifest["tables"]["a_0"]["crc32"]["../../x"] = fmt.crc32(str(outside))  # would even verify
    (tmp_path / "deep" / "ck" / fmt.MANIFEST).write_text(json.dumps(manifest))
    opened.clear()  # what inspect opens, from here on
    with pytest.raises(fmt.CheckpointError, match=r"crc32 file '\.\./\.\./x' is refused: it contains a path separator"):
        ckpt_inspect(path)
    resolved = {os.path.normpath(os.path.join(path, p)) for p in opened}
    assert str(outside) not in resolved


def test_inspect_refuses_a_table_named_dot_dot(tmp_path):
    path = str(tmp_path / "ck")
    os.makedirs(path)
    write_table(path, "..", np.array([1, 2], np.int64), np.ones((2, DIM), np.float32))  # files ..-key, ..-weight
    with pytest.raises(fmt.CheckpointError, match=r"table '\.\.' is refused: it is '\.' or '\.\.'"):
        ckpt_inspect(path)
