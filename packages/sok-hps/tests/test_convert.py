"""SOK checkpoints to HPS's sparse-model layout: ``convert_to_hps`` and ``sok ckpt convert``.

* A checkpoint of sok.dump (a trained DynamicVariable and a sok.Variable) converts to
  ``<table>/key`` (int64) and ``<table>/emb_vector`` (float32 rows) holding the same rows by key;
  a corrupt checkpoint is refused with the file named.
* NVIDIA SOK's layout (no manifest) converts too; uint64 keys keep their bits.
* The conversion imports no TensorFlow.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hierarchical_parameter_server.convert import convert_to_hps
from sparse_operation_kit.checkpoint import format as fmt
from sparse_operation_kit.cli import main as cli_main
from sparse_operation_kit.progress import Callback

DIM = 4
V = 8  # rows of the dynamic table
STATIC_ROWS = 10


def by_key(keys, values) -> tuple[np.ndarray, np.ndarray]:
    keys, values = np.asarray(keys), np.asarray(values)
    order = np.argsort(keys, kind="stable")
    return keys[order], values[order]


def sok_checkpoint(tmp_path):
    """sok.dump of a DynamicVariable trained one step with Adagrad and of a static sok.Variable:
    ``(path, {table: (keys, rows) by key})``."""
    tf = pytest.importorskip("tensorflow")
    import sparse_operation_kit as sok

    dyn = sok.DynamicVariable(
        dimension=DIM, var_type="hybrid", name="dyn", initializer="0.5", init_capacity=1024, max_capacity=1 << 16
    )
    initial = np.random.default_rng(0).uniform(-1.0, 1.0, (V, DIM)).astype(np.float32)
    sok.assign(dyn, tf.range(V, dtype=dyn.key_type), initial)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(dyn, tf.constant([0, 1, 2, 3, 0], dyn.key_type))))
    wrapper.apply_gradients(zip(tape.gradient(loss, [dyn]), [dyn]))
    static_rows = np.arange(STATIC_ROWS * DIM, dtype=np.float32).reshape(STATIC_ROWS, DIM) / 7
    static = sok.Variable(static_rows, dtype=tf.float32, name="static")
    path = str(tmp_path / "ckpt")
    sok.dump(path, [dyn, static], wrapper)
    expected = {"dyn_0": by_key(*sok.export(dyn)), "static_0": (np.arange(STATIC_ROWS), static_rows)}
    return path, expected


def test_cli_convert_to_hps(tmp_path, capsys):
    path, expected = sok_checkpoint(tmp_path)
    out_dir = str(tmp_path / "hps")
    assert cli_main(["ckpt", "convert", path, out_dir]) == 0
    assert "wrote 2 HPS table directories" in capsys.readouterr().out
    assert sorted(os.listdir(out_dir)) == ["dyn_0", "static_0"]
    for table, (keys, rows) in expected.items():
        assert sorted(os.listdir(os.path.join(out_dir, table))) == ["emb_vector", "key"]
        got_keys = np.fromfile(os.path.join(out_dir, table, "key"), dtype=np.int64)
        got_rows = np.fromfile(os.path.join(out_dir, table, "emb_vector"), dtype=np.float32)
        got_keys, got_rows = by_key(got_keys, got_rows.reshape(-1, DIM))
        np.testing.assert_array_equal(got_keys, keys)
        np.testing.assert_array_equal(got_rows, rows)
        assert os.path.getsize(os.path.join(out_dir, table, "emb_vector")) == 4 * DIM * len(keys)


def test_cli_convert_refuses_corrupt_checkpoint(tmp_path, capsys):
    path, _ = sok_checkpoint(tmp_path)
    os.truncate(os.path.join(path, "dyn_0-weight"), os.path.getsize(os.path.join(path, "dyn_0-weight")) - 2)
    assert cli_main(["ckpt", "convert", path, str(tmp_path / "hps")]) == 2
    assert "dyn_0-weight" in capsys.readouterr().err


def nvidia_checkpoint(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One table in NVIDIA SOK's layout (no manifest) with uint64 keys: ``(keys, rows)``."""
    keys = np.array([2**64 - 1, 7, 2**63], np.uint64)
    rows = np.arange(3 * DIM, dtype=np.float32).reshape(3, DIM)
    os.makedirs(path)
    for name, head, data in [
        (fmt.key_file("emb_0"), fmt.header(fmt.FILE_KEY, "uint64"), keys),
        (fmt.weight_file("emb_0"), fmt.header(fmt.FILE_WEIGHT, "float32"), rows),
    ]:
        with open(os.path.join(path, name), "wb") as f:
            f.write(head + data.tobytes())
    return keys, rows


class Steps(Callback):
    def __init__(self) -> None:
        super().__init__()
        self.sizes: list[int] = []

    def set_size(self, size: int) -> None:
        self.sizes.append(size)
        super().set_size(size)


def test_nvidia_layout_converts_and_uint64_keys_keep_their_bits(tmp_path):
    path = str(tmp_path / "nvidia")
    keys, rows = nvidia_checkpoint(path)
    progress = Steps()
    assert convert_to_hps(path, str(tmp_path / "hps"), callback=progress) == [str(tmp_path / "hps" / "emb_0")]
    assert (progress.sizes, progress.value) == ([1], 1)
    got_keys = np.fromfile(tmp_path / "hps" / "emb_0" / "key", dtype=np.int64)
    np.testing.assert_array_equal(got_keys.view(np.uint64), keys)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "hps" / "emb_0" / "emb_vector", np.float32), rows.ravel())


def test_conversion_imports_no_tensorflow(tmp_path):
    path = str(tmp_path / "nvidia")
    nvidia_checkpoint(path)
    code = (
        "import sys\n"
        "from sparse_operation_kit.cli import main\n"
        f"rc = main(['ckpt', 'convert', {path!r}, {str(tmp_path / 'hps')!r}])\n"
        "sys.exit(rc if 'tensorflow' not in sys.modules else 99)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "wrote 1 HPS table directories" in result.stdout


def snapshot(root) -> dict[str, bytes | None]:
    """Every entry under ``root``: a file's bytes, None for a directory."""
    out: dict[str, bytes | None] = {}
    for parent, dirs, names in os.walk(root):
        out.update({os.path.relpath(os.path.join(parent, d), root): None for d in dirs})
        for name in names:
            with open(os.path.join(parent, name), "rb") as f:
                out[os.path.relpath(os.path.join(parent, name), root)] = f.read()
    return out


@pytest.mark.parametrize("with_manifest", [True, False], ids=["manifest", "nvidia-layout"])
def test_convert_refuses_a_table_named_dot_dot_and_writes_nothing(tmp_path, with_manifest):
    """A table named ``..`` would put its files in the output's parent: refused before anything is written."""
    path = str(tmp_path / "ck")
    os.makedirs(path)
    keys, rows = np.array([1, 2], np.int64), np.ones((2, DIM), np.float32)
    crc32 = {}
    for name, head, data in [
        (fmt.key_file(".."), fmt.header(fmt.FILE_KEY, "int64"), keys),
        (fmt.weight_file(".."), fmt.header(fmt.FILE_WEIGHT, "float32"), rows),
    ]:
        with open(os.path.join(path, name), "wb") as f:
            f.write(head + data.tobytes())
        crc32[name] = fmt.crc32(os.path.join(path, name))
    if with_manifest:
        entry = fmt.TableEntry(dim=DIM, rows=2, key_dtype="int64", slots=[], crc32=crc32)
        fmt.write_manifest(path, fmt.Manifest(tables={"..": entry}, world_size=1))
    output = tmp_path / "out" / "hps"
    before = snapshot(tmp_path)
    with pytest.raises(fmt.CheckpointError, match=r"table '\.\.' is refused: it is '\.' or '\.\.'"):
        convert_to_hps(path, str(output))
    assert snapshot(tmp_path) == before


def two_table_checkpoint(path: str, tables: list[str]) -> None:
    """NVIDIA SOK's layout with ``tables``, each of two int64 keys."""
    os.makedirs(path)
    for table in tables:
        for name, head, data in [
            (fmt.key_file(table), fmt.header(fmt.FILE_KEY, "int64"), np.array([1, 2], np.int64)),
            (fmt.weight_file(table), fmt.header(fmt.FILE_WEIGHT, "float32"), np.ones((2, DIM), np.float32)),
        ]:
            with open(os.path.join(path, name), "wb") as f:
                f.write(head + data.tobytes())


def failing_on(monkeypatch, table: str, error: BaseException, before=lambda: None) -> None:
    """The first read of ``table``'s weight file (``before()``, then) raises ``error``."""
    real, failed = fmt.payload, []

    def payload(info):
        if info.path.endswith(fmt.weight_file(table)) and not failed:
            failed.append(table)
            before()
            raise error
        return real(info)

    monkeypatch.setattr(fmt, "payload", payload)


def test_a_retried_conversion_leaves_no_table_of_the_checkpoint_it_first_read(tmp_path, monkeypatch):
    path, output = str(tmp_path / "ck"), tmp_path / "hps"
    two_table_checkpoint(path, ["emb_0", "emb_1"])
    two_table_checkpoint(str(tmp_path / "next"), ["emb_2"])

    def dump_replaces_it() -> None:
        os.rename(path, str(tmp_path / "gone"))
        os.rename(str(tmp_path / "next"), path)

    failing_on(monkeypatch, "emb_1", fmt.CheckpointChanged("replaced while read"), dump_replaces_it)
    assert convert_to_hps(path, str(output)) == [str(output / "emb_2")]
    assert sorted(os.listdir(output)) == ["emb_2"]
    assert sorted(os.listdir(tmp_path)) == ["ck", "gone", "hps"]  # no temporary directory left


def test_a_failed_conversion_leaves_the_output_as_it_was(tmp_path, monkeypatch):
    path, output = str(tmp_path / "ck"), tmp_path / "hps"
    two_table_checkpoint(path, ["emb_0", "emb_1"])
    (output / "emb_0").mkdir(parents=True)
    (output / "emb_0" / "key").write_bytes(b"old keys")
    (output / "dense").mkdir()
    before = snapshot(tmp_path)
    failing_on(monkeypatch, "emb_1", OSError(28, "No space left on device"))
    with pytest.raises(OSError, match="No space left"):
        convert_to_hps(path, str(output))
    assert snapshot(tmp_path) == before


def test_a_conversion_replaces_its_tables_and_keeps_the_other_entries_of_the_output(tmp_path):
    path, output = str(tmp_path / "ck"), tmp_path / "hps"
    two_table_checkpoint(path, ["emb_0", "emb_1"])
    (output / "emb_0").mkdir(parents=True)
    (output / "emb_0" / "stale").write_bytes(b"old")
    (output / "dense").mkdir()
    assert convert_to_hps(path, str(output)) == [str(output / "emb_0"), str(output / "emb_1")]
    assert sorted(os.listdir(output)) == ["dense", "emb_0", "emb_1"]
    assert sorted(os.listdir(output / "emb_0")) == ["emb_vector", "key"]
    assert sorted(os.listdir(tmp_path)) == ["ck", "hps"]
