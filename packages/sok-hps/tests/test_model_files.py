"""Tables of ``sparse_files``: the original's sparse-model directory and sok.dump checkpoints.

* A directory written with ``np.tofile`` reads back row for row, in any chunk size.
* Empty, truncated and wrong-dim files are refused with the file named.
* A ``sok.dump`` checkpoint table reads as the variable's rows (weights only), checked against its
  manifest; NVIDIA SOK's layout with uint64 keys keeps the keys' bits; a corrupt weight file is
  found by its checksum, by ``verify()`` before any row is read.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hierarchical_parameter_server.model_files import ModelFileError, open_table
from sparse_operation_kit.checkpoint import format as fmt

DIM = 4


def write_hps(path, keys, rows) -> str:
    os.makedirs(path, exist_ok=True)
    np.asarray(keys, np.int64).tofile(os.path.join(path, "key"))
    np.asarray(rows, np.float32).tofile(os.path.join(path, "emb_vector"))
    return str(path)


def read_all(table, chunk_rows):
    parts = list(table.chunks(chunk_rows))
    return np.concatenate([k for k, _ in parts]), np.concatenate([v for _, v in parts])


@pytest.mark.parametrize("chunk_rows", [1, 7, 100, 1000])
def test_hps_directory_round_trip(tmp_path, chunk_rows):
    rng = np.random.default_rng(1)
    keys = rng.permutation(10_000)[:100].astype(np.int64) - 50
    rows = rng.random((100, DIM), dtype=np.float32)
    table = open_table(write_hps(tmp_path / "t", keys, rows), DIM)
    assert (table.rows, table.dim, table.format) == (100, DIM, "hps")
    got_keys, got_rows = read_all(table, chunk_rows)
    np.testing.assert_array_equal(got_keys, keys)
    np.testing.assert_array_equal(got_rows, rows)
    assert got_keys.dtype == np.int64 and got_rows.dtype == np.float32 and got_rows.flags.writeable


def test_chunks_are_whole_rows(tmp_path):
    table = open_table(write_hps(tmp_path / "t", np.arange(10), np.zeros((10, DIM))), DIM)
    assert [len(k) for k, _ in table.chunks(4)] == [4, 4, 2]
    with pytest.raises(ValueError, match="chunk_rows must be >= 1"):
        next(table.chunks(0))


def test_wrong_dim_is_refused_with_the_dim_found(tmp_path):
    path = write_hps(tmp_path / "t", np.arange(10), np.zeros((10, 8)))
    with pytest.raises(ModelFileError, match=r"emb_vector has 320 bytes; 10 keys x dim 4 .* holds 8 floats per key"):
        open_table(path, DIM)


@pytest.mark.parametrize(
    ("key_bytes", "vec_bytes", "words"),
    [
        (0, 16, "key is empty"),
        (8, 0, "emb_vector is empty"),
        (12, 16, "key has 12 bytes, not a whole number of 8-byte"),
        (8, 15, "emb_vector has 15 bytes, not a whole number of 4-byte"),
    ],
)
def test_bad_sizes_are_refused(tmp_path, key_bytes, vec_bytes, words):
    path = tmp_path / "t"
    path.mkdir()
    (path / "key").write_bytes(b"\0" * key_bytes)
    (path / "emb_vector").write_bytes(b"\0" * vec_bytes)
    with pytest.raises(ModelFileError, match=words):
        open_table(path, DIM)


def test_missing_files_say_what_is_expected(tmp_path):
    with pytest.raises(ModelFileError, match="no table there; expected a sparse-model directory"):
        open_table(tmp_path / "nothing", DIM)
    (tmp_path / "half").mkdir()
    np.arange(3, dtype=np.int64).tofile(tmp_path / "half" / "key")
    with pytest.raises(ModelFileError, match="emb_vector is missing"):
        open_table(tmp_path / "half", DIM)


def nvidia_checkpoint(path, keys, rows) -> None:
    """One table ``emb_0`` in NVIDIA SOK's layout (headers, no manifest)."""
    os.makedirs(path)
    for name, head, data in [
        (fmt.key_file("emb_0"), fmt.header(fmt.FILE_KEY, keys.dtype.name), keys),
        (fmt.weight_file("emb_0"), fmt.header(fmt.FILE_WEIGHT, "float32"), rows),
    ]:
        with open(os.path.join(path, name), "wb") as f:
            f.write(head + data.tobytes())


def test_nvidia_checkpoint_uint64_keys_keep_their_bits(tmp_path):
    keys = np.array([2**64 - 1, 7, 2**63, 0], np.uint64)
    rows = np.arange(4 * DIM, dtype=np.float32).reshape(4, DIM)
    nvidia_checkpoint(tmp_path / "ck", keys, rows)
    table = open_table(tmp_path / "ck" / "emb_0", DIM)
    assert (table.rows, table.format) == (4, "sok")
    got_keys, got_rows = read_all(table, 3)
    np.testing.assert_array_equal(got_keys, keys.view(np.int64))
    assert got_keys[0] == -1 and got_keys[2] == np.iinfo(np.int64).min
    np.testing.assert_array_equal(got_rows, rows)


def test_checkpoint_with_the_wrong_dim_is_refused(tmp_path):
    nvidia_checkpoint(tmp_path / "ck", np.arange(3, dtype=np.int64), np.zeros((3, 8), np.float32))
    with pytest.raises(ModelFileError, match="rows of 8 floats, but the ps_config gives dim 4"):
        open_table(tmp_path / "ck" / "emb_0", DIM)


def sok_dump(path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """sok.dump of a DynamicVariable trained one step with Adagrad (optimizer state in the
    checkpoint too): ``{table: (keys, rows)}`` as sok.export gives them."""
    tf = pytest.importorskip("tensorflow")
    import sparse_operation_kit as sok

    dyn = sok.DynamicVariable(
        dimension=DIM, var_type="hybrid", name="dyn", initializer="0.5", init_capacity=1024, max_capacity=1 << 16
    )
    initial = np.random.default_rng(0).uniform(-1.0, 1.0, (50, DIM)).astype(np.float32)
    sok.assign(dyn, tf.constant(np.arange(50) * 1000 - 7, dyn.key_type), initial)
    wrapper = sok.OptimizerWrapper(tf.keras.optimizers.Adagrad(learning_rate=0.1))
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(tf.nn.embedding_lookup(dyn, tf.constant([993, 1993, -7], dyn.key_type))))
    wrapper.apply_gradients(zip(tape.gradient(loss, [dyn]), [dyn]))
    sok.dump(str(path), [dyn], wrapper)
    keys, rows = (np.asarray(a) for a in sok.export(dyn))
    return {"dyn_0": (keys, rows)}


def by_key(keys, rows):
    order = np.argsort(keys, kind="stable")
    return keys[order], rows[order]


def test_sok_dump_checkpoint_reads_as_a_table(tmp_path):
    expected = sok_dump(tmp_path / "ck")
    keys, rows = expected["dyn_0"]
    table = open_table(os.path.join(tmp_path, "ck", "dyn_0"), DIM)
    assert (table.rows, table.dim, table.format) == (len(keys), DIM, "sok")
    got_keys, got_rows = by_key(*read_all(table, 16))
    want_keys, want_rows = by_key(keys.astype(np.int64), rows)
    np.testing.assert_array_equal(got_keys, want_keys)
    np.testing.assert_array_equal(got_rows, want_rows)


def test_sok_dump_corrupt_weights_fail_the_checksum(tmp_path):
    sok_dump(tmp_path / "ck")
    weight = tmp_path / "ck" / "dyn_0-weight"
    data = bytearray(weight.read_bytes())
    data[-1] ^= 0x40
    weight.write_bytes(bytes(data))
    table = open_table(tmp_path / "ck" / "dyn_0", DIM)
    with pytest.raises(ModelFileError, match="does not match the checkpoint's checksum"):
        read_all(table, 16)


def test_verify_finds_corrupt_weights_before_any_row_is_read(tmp_path):
    sok_dump(tmp_path / "ck")
    open_table(tmp_path / "ck" / "dyn_0", DIM).verify()  # the checkpoint as dumped
    weight = tmp_path / "ck" / "dyn_0-weight"
    data = bytearray(weight.read_bytes())
    data[fmt.HEADER_BYTES] ^= 0x01  # the first row
    weight.write_bytes(bytes(data))
    with pytest.raises(ModelFileError, match="dyn_0: the weight file does not match the checkpoint's checksum"):
        open_table(tmp_path / "ck" / "dyn_0", DIM).verify()
    open_table(write_hps(tmp_path / "t", np.arange(3), np.zeros((3, DIM))), DIM).verify()  # no checksum


def test_sok_dump_truncated_weights_are_refused_at_open(tmp_path):
    sok_dump(tmp_path / "ck")
    weight = tmp_path / "ck" / "dyn_0-weight"
    os.truncate(weight, os.path.getsize(weight) - 4 * DIM)
    with pytest.raises(ModelFileError, match="dyn_0-weight"):
        open_table(tmp_path / "ck" / "dyn_0", DIM)
