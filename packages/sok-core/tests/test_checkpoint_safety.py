"""sok.dump never destroys what it did not write; sok.load checks everything before anything changes.

* dump replaces only a previous SOK checkpoint (or an empty directory): a directory with other files,
  the working directory, a sub-directory, a regular file are refused, named, and left as they were;
* leftovers of interrupted dumps are deleted by the next dump of the same path (except those a
  running dump holds), never renamed back into place; staging directories are refused by load and
  ``sok ckpt inspect``;
* keys that do not fit the variable's key type, and every field of a corrupt manifest, are errors
  raised before any table changes;
* manifest-less (NVIDIA layout) checkpoints are checked for what can be checked, with a warning that
  no checksums exist;
* checkpoint directories follow the umask.

Resharding and the other round trips are in test_checkpoint.py; failures on one of several ranks in
test_checkpoint_failures_multiprocess.py.
"""

from __future__ import annotations

import json
import logging
import os
import stat

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
import sparse_operation_kit as sok  # noqa: E402
from sparse_operation_kit.checkpoint import directory as ckdir  # noqa: E402
from sparse_operation_kit.checkpoint import format as fmt  # noqa: E402
from sparse_operation_kit.checkpoint.inspect import inspect as ckpt_inspect  # noqa: E402
from sparse_operation_kit.cli import main as cli_main  # noqa: E402

K = tf.keras.optimizers
DIM = 4
KEYS = np.array([0, 5, 9, 2**20 + 3, 77], np.int64)


def make_var(name: str = "emb", key_type=tf.int64, var_type: str = "hbm") -> sok.DynamicVariable:
    return sok.DynamicVariable(dimension=DIM, var_type=var_type, name=name, key_type=key_type, initializer="0")


def filled(name: str = "emb", keys: np.ndarray = KEYS, key_type=tf.int64) -> sok.DynamicVariable:
    var = make_var(name, key_type)
    rows = np.arange(len(keys) * DIM, dtype=np.float32).reshape(-1, DIM)
    sok.assign(var, tf.constant(keys, key_type), rows)
    return var


def contents(var) -> dict[int, list[float]]:
    keys, rows = (t.numpy() for t in sok.export(var))
    return {int(k): r.tolist() for k, r in zip(keys, rows)}


def entries(path) -> list[str]:
    """The names in ``path`` but dump lock files (``.<name>.sok-lock``, kept once made)."""
    return sorted(n for n in os.listdir(path) if not n.endswith(ckdir.LOCK_SUFFIX))


def tree(path) -> dict[str, bytes]:
    """Every file under ``path`` (relative name -> bytes), hidden ones too, but dump lock files."""
    out = {}
    for root, _, names in os.walk(path):
        for name in names:
            if name.endswith(ckdir.LOCK_SUFFIX):
                continue
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out


# -- dump replaces only SOK checkpoints ----------------------------------------------------------------
def test_dump_into_a_directory_with_other_files_refuses_and_keeps_them(tmp_path):
    path = tmp_path / "ck"
    path.mkdir()
    (path / "dense.weights.h5").write_text("x")
    before = tree(tmp_path)
    with pytest.raises(fmt.CheckpointError, match=r"will not replace .*ck: it holds 1 entry .*'dense.weights.h5'"):
        sok.dump(str(path), [filled()])
    assert tree(tmp_path) == before  # nothing deleted, hidden or added (no staging left)


def test_dump_into_the_working_directory_refuses(tmp_path, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.py").write_text("print('mine')")
    (work / "data").mkdir()
    monkeypatch.chdir(work)
    before = tree(tmp_path)
    with pytest.raises(fmt.CheckpointError, match=r"2 entries .*'data', 'train.py'"):
        sok.dump(".", [filled()])
    assert tree(tmp_path) == before


def test_dump_onto_a_regular_file_refuses_and_keeps_it(tmp_path):
    target = tmp_path / "model.ckpt"
    target.write_text("my file")
    with pytest.raises(fmt.CheckpointError, match=r"model.ckpt: it is a file"):
        sok.dump(str(target), [filled()])
    assert entries(tmp_path) == ["model.ckpt"] and target.read_text() == "my file"


def test_dump_next_to_a_previous_checkpoint_with_a_user_subdirectory_refuses(tmp_path):
    path = tmp_path / "ck"
    sok.dump(str(path), [filled()])
    (path / "dense").mkdir()
    (path / "dense" / "w.npy").write_bytes(b"123")
    before = tree(tmp_path)
    with pytest.raises(fmt.CheckpointError, match="'dense'"):
        sok.dump(str(path), [filled()])
    assert tree(tmp_path) == before


@pytest.mark.parametrize("previous", ["empty directory", "sok checkpoint", "nvidia layout"])
def test_dump_replaces_an_empty_directory_or_a_previous_checkpoint(tmp_path, previous):
    path = tmp_path / "ck"
    path.mkdir()
    if previous == "sok checkpoint":
        sok.dump(str(path), [filled("old_table")])
    elif previous == "nvidia layout":
        sok.dump(str(path), [filled("old_table")])
        os.remove(path / fmt.MANIFEST)
    var = filled()
    sok.dump(str(path), [var])
    assert sorted(os.listdir(path)) == ["emb_0-key", "emb_0-weight", fmt.MANIFEST]
    fresh = make_var()
    sok.load(str(path), [fresh])
    assert contents(fresh) == contents(var)
    assert entries(tmp_path) == ["ck"]


def test_dump_through_a_symbolic_link_replaces_its_target_and_keeps_the_link(tmp_path):
    target = tmp_path / "real"
    sok.dump(str(target), [filled("old_table")])
    link = tmp_path / "latest"
    link.symlink_to(target, target_is_directory=True)
    var = filled()
    sok.dump(str(link), [var])
    assert link.is_symlink() and sorted(os.listdir(target)) == ["emb_0-key", "emb_0-weight", fmt.MANIFEST]
    assert entries(tmp_path) == ["latest", "real"]


def test_dump_makes_missing_parent_directories(tmp_path):
    var = filled()
    path = tmp_path / "runs" / "exp1" / "ck"
    sok.dump(str(path), [var])
    fresh = make_var()
    sok.load(str(path), [fresh])
    assert contents(fresh) == contents(var)


# -- leftovers and staging directories -------------------------------------------------------------
def killed_dump(tmp_path, monkeypatch, var) -> str:
    """A dump killed after its table files were written, before its manifest: returns the staging
    directory it leaves (a killed process cleans nothing up and its lock is gone)."""
    path = str(tmp_path / "ck")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("SIGKILL")

    monkeypatch.setattr(fmt, "write_manifest", killed)
    monkeypatch.setattr(ckdir.Staging, "close", lambda self: os.close(self._lock))
    with pytest.raises(KeyboardInterrupt):
        sok.dump(path, [var])
    monkeypatch.undo()
    (staging,) = ckdir.leftovers(path)
    return staging


def test_staging_directory_of_a_killed_dump_is_refused_by_load_and_inspect(tmp_path, monkeypatch, capsys):
    var = filled()
    staging = killed_dump(tmp_path, monkeypatch, var)
    assert sorted(os.listdir(staging)) == [ckdir.STAGING_MARK, "emb_0-key", "emb_0-weight"]
    fresh = make_var()
    with pytest.raises(fmt.CheckpointError, match=r"staging directory of a sok.dump that did not finish.*incomplete"):
        sok.load(staging, [fresh])
    assert contents(fresh) == {}
    with pytest.raises(fmt.CheckpointError, match="staging directory"):
        ckpt_inspect(staging)
    assert cli_main(["ckpt", "inspect", staging]) == 2
    assert "staging directory" in capsys.readouterr().err
    # Renamed by the user, it is still recognised by its marker file.
    renamed = str(tmp_path / "looks_fine")
    os.rename(staging, renamed)
    with pytest.raises(fmt.CheckpointError, match="staging directory"):
        sok.load(renamed, [fresh])


def test_load_never_resurrects_a_deleted_checkpoint(tmp_path, monkeypatch):
    var = filled()
    path = str(tmp_path / "ck")
    sok.dump(path, [var])
    killed_dump(tmp_path, monkeypatch, var)  # a later dump of the same path was killed
    for name in os.listdir(path):
        os.remove(os.path.join(path, name))
    os.rmdir(path)  # the user deletes the checkpoint
    with pytest.raises(fmt.CheckpointError, match=r"no checkpoint directory .*interrupted dumps of it left"):
        sok.load(path, [make_var()])
    assert not os.path.exists(path)


def test_next_dump_deletes_leftovers_but_not_a_running_dumps_staging(tmp_path, monkeypatch):
    var = filled()
    path = str(tmp_path / "ck")
    first = killed_dump(tmp_path, monkeypatch, var)
    old = f"{first}.old"
    os.makedirs(old)  # an old checkpoint set aside by a swap that was killed
    with open(os.path.join(old, "emb_0-key"), "wb") as f:
        f.write(b"stale")
    running = ckdir.Staging(path)  # another dump of the same path, still writing
    try:
        sok.dump(path, [var])
        assert ckdir.leftovers(path) == [running.directory]
    finally:
        running.close()
    assert ckdir.leftovers(path) == [] and entries(tmp_path) == ["ck"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o002])
def test_checkpoint_directory_follows_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        sok.dump(str(tmp_path / "ck"), [filled()])
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "ck").st_mode) == 0o777 & ~umask
    assert stat.S_IMODE(os.stat(tmp_path / "ck" / "emb_0-weight").st_mode) == 0o666 & ~umask


# -- keys that do not fit the variable's key type ------------------------------------------------------
KEY_CASES = {
    # name: (keys written, dtype of the writer, key type of the reader, the key the error names)
    "int64 into int32": (np.array([3, 2**40 + 7, 9], np.int64), tf.int64, tf.int32, 2**40 + 7),
    "negative int64 into int32": (np.array([-(2**31) - 1, 4], np.int64), tf.int64, tf.int32, -(2**31) - 1),
    "negative into uint64": (np.array([5, -1], np.int64), tf.int64, tf.uint64, -1),
    "uint64 >= 2**63 into int64": (np.array([1, 2**63 + 5], np.uint64), tf.uint64, tf.int64, 2**63 + 5),
    "uint64 into int32": (np.array([2**31], np.uint64), tf.uint64, tf.int32, 2**31),
}


@pytest.mark.parametrize("case", KEY_CASES)
@pytest.mark.parametrize("holding", [False, True], ids=["empty", "holding-rows"])
def test_keys_that_do_not_fit_are_refused_and_nothing_is_loaded(tmp_path, case, holding):
    keys, writer_type, reader_type, first = KEY_CASES[case]
    path = str(tmp_path / "ck")
    sok.dump(path, [filled(keys=keys, key_type=writer_type)])
    var = make_var(key_type=reader_type)
    if holding:  # a table that holds rows is staged; an empty one is filled while reading
        sok.assign(var, tf.constant([1, 2], reader_type), np.ones((2, DIM), np.float32))
    before = contents(var)
    with pytest.raises(fmt.CheckpointError, match=rf"holds key {first} .*does not fit the {reader_type.name} keys"):
        sok.load(path, [var])
    assert contents(var) == before


def test_keys_that_fit_a_narrower_key_type_load(tmp_path):
    keys = np.array([-(2**31), 0, 2**31 - 1, 12345], np.int64)
    path = str(tmp_path / "ck")
    source = filled(keys=keys)
    sok.dump(path, [source])
    var = make_var(key_type=tf.int32)
    sok.load(path, [var])
    assert contents(var) == contents(source)


# -- the manifest, validated whole before anything changes -----------------------------------------
def trained_checkpoint(tmp_path):
    var, wrapper = filled(), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.nn.embedding_lookup(var, tf.constant(KEYS[:3])))
    wrapper.apply_gradients(zip(tape.gradient(loss, [var]), [var]))
    path = str(tmp_path / "ck")
    sok.dump(path, [var], wrapper)
    return path


def edit_manifest(path: str, edit) -> None:
    file = os.path.join(path, fmt.MANIFEST)
    with open(file) as f:
        manifest = json.load(f)
    edit(manifest)
    with open(file, "w") as f:
        json.dump(manifest, f)


T = "emb_0"  # the table name of make_var()'s variable "emb:0"


def table_entry(m: dict) -> dict:
    return m["tables"][T]


MANIFEST_CORRUPTIONS = {
    "step is a string": (lambda m: m.update(step="abc"), r"field step is 'abc'; expected an integer >= 0"),
    "step is a bool": (lambda m: m.update(step=True), r"field step is True"),
    "negative world size": (lambda m: m.update(world_size=-1), r"field world_size is -1"),
    "optimizer_step float": (lambda m: m.update(optimizer_step=1.5), r"field optimizer_step is 1.5"),
    "tables a list": (lambda m: m.update(tables=[]), r"field tables is \[\]"),
    "dim a string": (lambda m: table_entry(m).update(dim="4"), r"field tables.emb_0.dim is '4'"),
    "rows disagree": (lambda m: table_entry(m).update(rows=4), r"has rows 4 but its files have 5"),
    "dim disagrees": (lambda m: table_entry(m).update(dim=8), r"has dim 8 but its files have 4"),
    "key dtype disagrees": (lambda m: table_entry(m).update(key_dtype="int32"), r"key_dtype 'int32' but"),
    "unknown key dtype": (lambda m: table_entry(m).update(key_dtype="float32"), r"tables.emb_0.key_dtype"),
    "slots not a list": (lambda m: table_entry(m).update(slots="accumulator"), r"tables.emb_0.slots"),
    "checksum missing": (
        lambda m: table_entry(m)["crc32"].pop("emb_0-weight"),
        r"no checksum for .*emb_0-weight",
    ),
    "checksum not hex": (lambda m: table_entry(m)["crc32"].update({"emb_0-key": "xyz"}), r"crc32.emb_0-key is"),
    "table not listed": (lambda m: m.update(tables={}), r"does not list table 'emb_0'"),
    "entry lacks rows": (lambda m: table_entry(m).pop("rows"), r"lacks the field 'rows'"),
    "checksum of a file outside": (
        lambda m: table_entry(m)["crc32"].update({"../../x": "00000000"}),
        r"crc32 file '\.\./\.\./x' is refused: it contains a path separator",
    ),
    "table named ..": (lambda m: m["tables"].update({"..": dict(table_entry(m))}), r"table '\.\.' is refused"),
}


@pytest.mark.parametrize("corruption", MANIFEST_CORRUPTIONS)
def test_corrupt_manifest_fields_are_refused_before_anything_changes(tmp_path, corruption):
    edit, message = MANIFEST_CORRUPTIONS[corruption]
    path = trained_checkpoint(tmp_path)
    edit_manifest(path, edit)
    var, wrapper = make_var(), sok.OptimizerWrapper(K.Adagrad(learning_rate=0.1))
    with pytest.raises(fmt.CheckpointError, match=message):
        sok.load(path, [var], wrapper)
    assert contents(var) == {} and int(wrapper.iterations.numpy()) == 0
    with pytest.raises(fmt.CheckpointError, match=message):
        ckpt_inspect(path)


@pytest.mark.parametrize(
    "content, message",
    [
        (b"[1, 2, 3]", r"manifest.json is not a valid manifest: it holds a JSON list"),
        (b'"text"', r"manifest.json is not a valid manifest: it holds a JSON str"),
        (bytes(range(256)) * 4, r"manifest.json is not a valid manifest \(UTF-8 JSON\)"),
        (b"{not json", r"manifest.json is not a valid manifest \(UTF-8 JSON\)"),
    ],
    ids=["list", "string", "binary", "broken"],
)
def test_malformed_manifest_is_a_checkpoint_error_naming_the_file(tmp_path, content, message):
    path = trained_checkpoint(tmp_path)
    with open(os.path.join(path, fmt.MANIFEST), "wb") as f:
        f.write(content)
    var = make_var()
    with pytest.raises(fmt.CheckpointError, match=message):
        sok.load(path, [var])
    assert contents(var) == {}


# -- checkpoints without a manifest ----------------------------------------------------------------
def manifestless(tmp_path) -> tuple[str, sok.DynamicVariable]:
    var = filled()
    path = str(tmp_path / "ck")
    sok.dump(path, [var])
    os.remove(os.path.join(path, fmt.MANIFEST))
    return path, var


def test_manifestless_load_warns_that_no_checksums_exist(tmp_path, caplog):
    path, source = manifestless(tmp_path)
    var = make_var()
    with caplog.at_level(logging.WARNING, logger="sparse_operation_kit.checkpoint.directory"):
        sok.load(path, [var])
    assert contents(var) == contents(source)
    assert any("no checksums" in r.getMessage() for r in caplog.records)
    assert ckpt_inspect(path)["checksums"] == "not available"


def test_manifestless_load_refuses_key_and_weight_files_of_different_lengths(tmp_path):
    path, _ = manifestless(tmp_path)
    with open(os.path.join(path, "emb_0-key"), "ab") as f:
        f.write(np.array([12345], np.int64).tobytes())  # 6 keys, 5 rows
    var = make_var()
    with pytest.raises(fmt.CheckpointError, match=r"emb_0-weight holds 20 floats, not a whole number of rows"):
        sok.load(path, [var])
    with pytest.raises(fmt.CheckpointError, match="not a whole number of rows"):
        ckpt_inspect(path)
    assert contents(var) == {}


def test_manifestless_state_file_of_another_length_is_refused_by_inspect(tmp_path):
    path, _ = manifestless(tmp_path)
    rows = np.ones((3, DIM), np.float32)  # 3 rows where the table has 5
    with open(os.path.join(path, "emb_0-Adagrad-accumulator"), "wb") as f:
        f.write(fmt.header(fmt.FILE_STATE, "float32", "accumulator") + rows.tobytes())
    with pytest.raises(fmt.CheckpointError, match=r"emb_0-Adagrad-accumulator holds 12 float32 values; expected 5 x"):
        ckpt_inspect(path)


def test_inspect_of_an_empty_directory_fails(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(fmt.CheckpointError, match="holds no checkpoint table"):
        ckpt_inspect(str(tmp_path / "empty"))
    assert cli_main(["ckpt", "inspect", str(tmp_path / "empty")]) == 2
    assert "holds no checkpoint table" in capsys.readouterr().err
