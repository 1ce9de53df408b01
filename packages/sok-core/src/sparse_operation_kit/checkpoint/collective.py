"""``sok.dump`` / ``sok.load`` (checkpoints that reshard) and ``sok.incremental_model_dump``.

Files follow NVIDIA SOK's layout (``checkpoint.format``). ``dump`` is collective: every rank sends
its shard to rank 0 in rounds of at most 64 MiB, and rank 0 writes a new directory beside ``path``
and swaps it in only when every file is written and synced, so a crash leaves the previous
checkpoint intact; dumps of one path from several processes take turns (``checkpoint.directory``).
Every rank must pass the same ``path`` to ``dump`` and ``load``: the ranks check it, and all raise
CheckpointError naming each rank's path when they differ.

``load`` gives each rank the rows it owns under the *current* world size and layout (any world
size to any other, distributed and localized, det to hkv and back), all or nothing: it checks
every file (headers, sizes, dims, slot files, the manifest's checksums) on every rank before any
variable keeps a row. It reads the checkpoint directory through one handle, so a dump that
replaces ``path`` meanwhile cannot mix two checkpoints; when that dump deletes the files being
read, the load starts again (``checkpoint.directory.read_consistently``). Most tables are read into
memory and assigned once every file is verified; a dynamic table that is empty when the load
starts (and needs no new optimizer columns) is filled while its files are read, which hides the
inserts behind the reads, and is emptied again if any file of the checkpoint turns out bad.

The manifest is :class:`~sparse_operation_kit.checkpoint.format.Manifest`, built here and read
through it. Reading a checkpoint without TensorFlow (``sok ckpt inspect``) is
:mod:`~sparse_operation_kit.checkpoint.inspect`; the conversion to HPS's layout is sok-hps's
(``hierarchical_parameter_server.convert``).

Example::

    sok.dump("ckpt", [v1, v2], optimizer)     # optimizer: a sok.OptimizerWrapper, its Keras optimizer, or None
    sok.load("ckpt", [v1, v2], optimizer)
"""

from __future__ import annotations

import datetime as dt
import logging
import os
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import tensorflow as tf

from sparse_operation_kit import _table, communication
from sparse_operation_kit.agreement import Agreement
from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt
from sparse_operation_kit.distributed_variable import DistributedVariable, LocalizedVariable, is_static
from sparse_operation_kit.dtypes import VALUE_DTYPE
from sparse_operation_kit.dynamic_variable import DynamicVariable
from sparse_operation_kit.optimizer import OptimizerWrapper, checkpoint_aliases, is_keras_optimizer, wrappers_of
from sparse_operation_kit.progress import Callback, NoOpCallback
from sparse_operation_kit.row_layout import RowLayout

logger = logging.getLogger(__name__)

__all__ = ["TableNotRestored", "dump", "load", "incremental_model_dump"]


class TableNotRestored(RuntimeError):
    """A failed ``sok.load`` could not empty again a table it had filled while reading: the table
    holds part of a checkpoint. Fatal: the load is not retried; recreate the variable."""


def _variables(variables: Any) -> list:
    items = list(variables) if isinstance(variables, (list, tuple)) else [variables]
    for i, v in enumerate(items):
        if not isinstance(v, (DynamicVariable, DistributedVariable, LocalizedVariable)):
            raise TypeError(
                f"variable {i} is a {type(v).__name__}; dump/load take sok.Variable and sok.DynamicVariable"
            )
    tables = [fmt.table_name(v.name) for v in items]
    duplicates = sorted({t for t in tables if tables.count(t) > 1})
    if duplicates:
        raise ValueError(f"several variables map to the same checkpoint name(s) {duplicates}; give them distinct names")
    return items


def _optimizer(optimizer: Any, variables: list) -> OptimizerWrapper | None:
    """The wrapper whose state to dump or load: ``optimizer`` itself when it is one; for a Keras
    optimizer (as NVIDIA SOK takes it), the ``sok.OptimizerWrapper`` that wraps it and updates the
    dynamic ones among ``variables`` (or the only one that wraps it), else a
    :meth:`~OptimizerWrapper.for_static_state` one (its state of static tables only)."""
    if isinstance(optimizer, (list, tuple)) and len(optimizer) == 1:
        optimizer = optimizer[0]
    if optimizer is None or isinstance(optimizer, OptimizerWrapper):
        return optimizer
    if not is_keras_optimizer(optimizer):
        raise TypeError(
            f"optimizer must be None, a sok.OptimizerWrapper or a Keras optimizer (Keras 3, tf_keras or tf_keras "
            f"legacy), got {type(optimizer).__name__} {optimizer!r}"
        )
    owners: dict[int, OptimizerWrapper] = {}
    for var in variables:
        owner = var.optimizer_wrapper if isinstance(var, DynamicVariable) else None
        if isinstance(var, DynamicVariable) and owner is not None and owner.wraps(optimizer):
            owners[id(owner)] = owner
    if len(owners) > 1:
        raise ValueError(
            f"the dynamic variables are updated by {len(owners)} different sok.OptimizerWrappers of "
            f"{type(optimizer).__name__}; dump / load each wrapper's variables with that wrapper"
        )
    if owners:
        return next(iter(owners.values()))
    wrappers = wrappers_of(optimizer)
    if len(wrappers) == 1:
        return wrappers[0]
    if len(wrappers) > 1 and any(isinstance(v, DynamicVariable) for v in variables):
        raise ValueError(
            f"{len(wrappers)} sok.OptimizerWrappers wrap this {type(optimizer).__name__}, and none of them has "
            f"updated these dynamic variables yet; pass the wrapper whose state to load"
        )
    try:
        return OptimizerWrapper.for_static_state(optimizer)
    except ValueError as error:
        raise ValueError(f"sok.dump / sok.load cannot name the state of this optimizer: {error}") from error


def _slots(var: Any, optimizer: OptimizerWrapper | None) -> list[str]:
    """Slot names stored for ``var``: a dynamic variable's state in this wrapper's rows, or the
    wrapped Keras optimizer's state of a static one (none when it has not been trained)."""
    if optimizer is None:
        return []
    if not isinstance(var, DynamicVariable):
        return list(optimizer.static_slots(var))
    if var.optimizer_wrapper is not optimizer:
        return []
    return optimizer.get_slot_names()


def _layout(dim: int, slots: list[str], optimizer: OptimizerWrapper | None) -> RowLayout:
    """The rows (and files) of a table of dimension ``dim`` holding ``slots`` of ``optimizer``'s
    state (all of its slots, or none): each slot as wide as the optimizer keeps it."""
    return optimizer.row_layout(dim) if slots else RowLayout(dim)


def _shard_chunks(var: Any, layout: RowLayout, rows: int, optimizer: OptimizerWrapper | None) -> tuple[int, Any]:
    """(number of chunks, iterator of (keys, [weights, slot 1, ...])) over this rank's shard, at
    most ``rows`` rows per chunk, streamed from the table in its export order (bounded memory;
    loading places rows by key, so the order in the files does not matter). ``layout``: the rows
    and files of the dump (:func:`_layout`; its slots are those stored).

    A CPU table exports into two sets of buffers taken in turn: a chunk's arrays stay valid until
    the next but one is made, which :func:`_read_ahead` guarantees (it starts a chunk only when the
    one before the last has been consumed)."""
    slots = layout.slots
    if isinstance(var, DynamicVariable):
        storage = var.storage
        capacity = storage.capacity()
        buffers = [_ChunkBuffers(rows, storage.key_dtype, layout) for _ in range(2)]

        def dynamic():
            for turn, offset in enumerate(range(0, capacity, rows)):
                out = buffers[turn % 2].out if storage.device == "cpu" else None
                keys, values, _ = storage.export_batch(offset, rows, columns=(0, layout.width), out=out)
                yield keys, buffers[turn % 2].split(values)

        return -(-capacity // rows), dynamic()
    state = optimizer.static_slots(var) if slots else {}
    tables = [var.numpy().astype(np.float32)] + [state[s].numpy().astype(np.float32) for s in slots]
    local = np.arange(tables[0].shape[0], dtype=np.int64)
    keys = local if isinstance(var, LocalizedVariable) else local * var.num_gpus + var.global_gpu_id
    count = -(-tables[0].shape[0] // rows)
    return count, ((keys[i : i + rows], [t[i : i + rows] for t in tables]) for i in range(0, tables[0].shape[0], rows))


class _ChunkBuffers:
    """Reused arrays for one exported chunk: keys, whole rows, and (with optimizer state) each
    file's columns, so a dump touches fresh memory once, not once per chunk."""

    def __init__(self, rows: int, key_dtype: np.dtype, layout: RowLayout) -> None:
        self.out = (np.empty(rows, key_dtype), np.empty((rows, layout.width), np.float32))
        self.layout = layout
        self.columns = [np.empty((rows, width), np.float32) for width in layout.part_widths] if layout.slots else []

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        """``values [m, layout.width]`` as one contiguous array per file (``[m, dim]``, then each slot's)."""
        if not self.columns:
            return [values]
        parts = [column[: values.shape[0]] for column in self.columns]
        for part, block in zip(parts, self.layout.split(values), strict=True):
            np.copyto(part, block)
        return parts


def _read_ahead(chunks: Iterator) -> Generator:
    """Yields the items of ``chunks``, computing the next one in a thread (table exports release
    the GIL) while the caller sends and writes the current one."""
    with ThreadPoolExecutor(1) as producer:
        pending = producer.submit(next, chunks, None)
        while (item := pending.result()) is not None:
            pending = producer.submit(next, chunks, None)
            yield item


def _key_dtype(var: Any) -> str:
    return var.key_type.name if isinstance(var, DynamicVariable) else "int64"


def dump(path: str, dump_vars: Any, optimizer: Any = None, callback: Callback | None = None) -> None:
    """Write the variables (and the optimizer state: of dynamic ones in the wrapper's rows, of static
    ones in the wrapped Keras optimizer) to directory ``path``.

    Collective: every rank calls it with the same ``path`` and variables. ``path`` must be new, an
    empty directory or a previous SOK checkpoint, which is replaced atomically (``checkpoint.directory``);
    a directory holding anything else, or a file, is refused and left as it is. A failure on any
    rank (a full disk, a table that cannot be exported) stops the dump on every rank, with an error
    on each, and leaves ``path`` as it was. Another process's dump of the same path may run at the
    same time: the two take turns to create their staging directories and to swap (waiting at
    most ``checkpoint.directory.LOCK_WAIT_S`` seconds each time), and the last to swap wins.

    Args:
        path: the checkpoint directory.
        dump_vars: a variable or a list of them (``sok.Variable``, ``sok.DynamicVariable``).
        optimizer: None (weights only); a ``sok.OptimizerWrapper``; or a Keras optimizer (tf_keras
            legacy, tf_keras or Keras 3; a one-element list too), as NVIDIA SOK takes it: its state of
            static tables is saved, and that of dynamic tables which a ``sok.OptimizerWrapper`` of
            this very optimizer updates (that wrapper's state, and its step in the manifest). A
            Keras optimizer that no wrapper wraps saves its state of static tables only (the
            manifest's ``step`` is then None; ``optimizer_step`` is the Keras optimizer's).
        callback: progress (one step per table).

    Raises:
        CheckpointError: ``path`` holds files that are not SOK's, or is a file; the ranks passed
            different paths (on every rank, naming them); another dump of ``path`` held its lock
            for ``checkpoint.directory.LOCK_WAIT_S`` seconds (naming that process).
        RankFailure: another rank failed (its message is included).
        TypeError: ``optimizer`` is none of those.
        ValueError: the dynamic variables are updated by several wrappers of the Keras optimizer.
    """
    variables = _variables(dump_vars)
    wrapper = _optimizer(optimizer, variables)
    comm = communication.tool()
    rank, n = comm.rank(), comm.num_ranks()
    callback = callback or NoOpCallback()
    agreement = Agreement(comm, f"sok.dump to {path}")
    _check_same_path(agreement, path, "rank 0 writes the checkpoint, the other ranks' paths would be ignored")
    staging: ckdir.Staging | None = None
    if rank == 0:
        staging = agreement.run(ckdir.Staging, path)
    manifest = fmt.Manifest(
        world_size=n,
        optimizer=wrapper.name if wrapper else None,
        # The wrapper's step (dynamic tables); None without one (no optimizer, or a Keras optimizer
        # that no wrapper wraps).
        step=int(wrapper.iterations.numpy()) if wrapper and not wrapper.static_only else None,
        # The wrapped Keras optimizer's own step (its bias corrections for static tables).
        optimizer_step=int(wrapper.optimizer.iterations.numpy()) if wrapper else None,
    )
    try:
        agreement.check()
        callback.set_size(len(variables))
        for var in variables:
            slots = _slots(var, wrapper)
            entry = _dump_variable(staging.directory if staging else None, var, slots, wrapper, comm, agreement)
            if rank == 0:
                manifest.tables[fmt.table_name(var.name)] = entry
            callback.relative_update(1)
        if staging is not None:
            agreement.run(fmt.write_manifest, staging.directory, manifest)
            agreement.run(staging.swap_into_place)
        agreement.check()
    finally:
        if staging is not None:
            staging.close()
    logger.info("SOK dump to %s done: %d tables", path, len(variables))


def _check_same_path(agreement: Agreement, path: str, why: str) -> None:
    """Collective: every rank raises CheckpointError, naming each rank's path, unless all passed the
    same one (compared as ``os.path.normpath`` makes them)."""
    paths = agreement.texts(os.path.normpath(os.fspath(path)))
    if len(set(paths)) > 1:
        listed = ", ".join(f"rank {r}: {p!r}" for r, p in enumerate(paths))
        raise fmt.CheckpointError(
            f"{agreement.call}: the ranks passed different paths ({listed}); every rank must pass the same path "
            f"({why}). Nothing was read or written"
        )


def _dump_variable(
    staging: str | None,
    var: Any,
    slots: list[str],
    wrapper: OptimizerWrapper | None,
    comm: communication.CommunicationTool,
    agreement: Agreement,
) -> fmt.TableEntry:
    """Gather ``var``'s shards round by round and (on rank 0, ``staging`` set) write its files; return
    its manifest entry (with the files' checksums on rank 0). The ranks agree on failures before each
    round's exchange, so none is left waiting."""
    table, dim = fmt.table_name(var.name), var.dimension
    key_dtype = _key_dtype(var)
    names = [fmt.key_file(table), fmt.weight_file(table)] + [fmt.state_file(table, wrapper.name, s) for s in slots]
    headers = [fmt.header(fmt.FILE_KEY, key_dtype), fmt.header(fmt.FILE_WEIGHT, "float32")] + [
        fmt.header(fmt.FILE_STATE, "float32", s) for s in slots
    ]
    files: list = []
    crcs: list[int] = [fmt.update_crc32(head) for head in headers]
    checksums, writeback = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
    chunks: Iterator | None = None

    def open_files() -> None:
        for name, head in zip(names, headers):
            files.append(open(os.path.join(staging, name), "wb"))
            files[-1].write(head)

    def write(pieces: list[np.ndarray]) -> None:
        # Each file's checksum is computed by a thread while the next file is written, and the
        # disk starts on each written piece at once (the fsync at the end waits less).
        raws = [np.ascontiguousarray(p).view(np.uint8).reshape(-1) for p in pieces]
        sums = [checksums.submit(fmt.update_crc32, raw, crcs[j]) for j, raw in enumerate(raws)]
        for f, raw in zip(files, raws):
            start = f.tell()
            f.write(raw)
            writeback.submit(_start_writeback, f.fileno(), start, raw.nbytes)
        crcs[:] = [s.result() for s in sums]

    def sync() -> None:
        for f in files:
            f.flush()
            os.fsync(f.fileno())

    try:
        if staging is not None:
            agreement.run(open_files)
        # A round's rows: one export chunk's bytes per rank (every rank holds num_ranks rounds' worth after
        # the allgather), so the rows depend on the row width (keys, weights and slots).
        layout = _layout(dim, slots, wrapper)
        rows_per_round = max(1, _table.EXPORT_CHUNK_BYTES // (4 * layout.width + 8))
        n = comm.num_ranks()
        shard = agreement.run(_shard_chunks, var, layout, rows_per_round, wrapper)
        agreement.check()
        count, chunks = shard
        chunks = _read_ahead(chunks)
        rounds = count if n == 1 else int(comm.allgather(tf.constant([count], tf.int64)).numpy().max())
        empty = (np.empty(0, key_dtype), [np.empty((0, width), np.float32) for width in layout.part_widths])
        total = 0
        for _ in range(rounds):
            item = agreement.run(next, chunks, empty)  # a rank with fewer chunks sends empty ones
            agreement.check()
            keys, arrays = item
            pieces = [keys] + arrays
            if n > 1:
                gathered = [comm.allgather(tf.constant(pieces[0]))] + [
                    comm.allgather(tf.constant(p.reshape(-1, dim))) for p in pieces[1:]
                ]
                pieces = [g.numpy() for g in gathered]
            if staging is not None:
                agreement.run(write, pieces)
            total += pieces[0].shape[0]
        entry = fmt.TableEntry(
            variable=var.name,
            dim=dim,
            rows=int(total),
            key_dtype=key_dtype,
            slots=slots,
            dtype=var.dtype.name if is_static(var) else VALUE_DTYPE,
            kind="dynamic" if isinstance(var, DynamicVariable) else "static",
            mode=getattr(var, "mode", None)
            if isinstance(var, DynamicVariable)
            else (f"localized:{var.target_gpu}" if isinstance(var, LocalizedVariable) else "distributed"),
        )
        if staging is not None:
            agreement.run(sync)
            entry.crc32 = {name: f"{c:08x}" for name, c in zip(names, crcs)}
        agreement.check()
        return entry
    finally:
        if isinstance(chunks, Generator):
            chunks.close()  # stops its read-ahead thread now, not whenever the generator is collected
        checksums.shutdown(wait=True)
        writeback.shutdown(wait=True)
        for f in files:
            f.close()


def _start_writeback(fd: int, start: int, length: int) -> None:
    """Have the OS start writing ``[start, start + length)`` of a file to disk now (Linux starts the
    writeback of dirty pages on ``POSIX_FADV_DONTNEED`` and drops the pages already written, so a
    big dump neither waits for the page cache to fill nor floods it). A hint: fsync still decides."""
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, start, length, os.POSIX_FADV_DONTNEED)


def _plan(ckpt: ckdir.OpenCheckpoint, var: Any, slots: list[str], wrapper: OptimizerWrapper | None) -> dict:
    """Check one table's headers, sizes, dims and slot files, and the manifest's entry of it; return
    what to read. Raises CheckpointError before anything is read (the contents are checked by
    :func:`_stage`)."""
    table, dim, manifest = fmt.table_name(var.name), var.dimension, ckpt.manifest
    key_info, weight_info, rows = ckpt.table_files(table)
    if rows and weight_info.elements // rows != dim:
        raise fmt.CheckpointError(
            f"{weight_info.path} has rows of width {weight_info.elements // rows} but {var.name} has dimension {dim}"
        )
    files = [key_info, weight_info]
    if manifest is not None and table in manifest.tables and not manifest.tables[table].slots:
        slots = []  # our manifest says this table had no optimizer state (it was never trained)
    layout = _layout(dim, slots, wrapper)
    for slot, width in zip(slots, layout.widths, strict=True):
        candidates = [fmt.state_file(table, wrapper.name, slot)] + [
            fmt.state_file(table, opt, alias) for opt, alias in checkpoint_aliases(wrapper.name, slot)
        ]
        found = [c for c in candidates if ckpt.exists(c)]
        if not found:
            raise fmt.CheckpointError(
                f"optimizer state file {ckpt.file(candidates[0])} is missing ({wrapper.name} "
                f"slot {slot!r} of {var.name}); load without the optimizer to skip its state"
            )
        info = ckpt.read_header(found[0])
        if info.elements != rows * width or info.dtype != "float32":
            raise fmt.CheckpointError(
                f"{info.path} holds {info.elements} {info.dtype} values; expected {rows} x {width} float32 "
                f"({wrapper.name} keeps {'one float per row' if width != dim else 'one per column'} of slot {slot!r})"
            )
        files.append(info)
    if not isinstance(var, DynamicVariable) and rows != int(var.global_shape[0]):
        raise fmt.CheckpointError(f"{key_info.path} has {rows} rows but {var.name} has {int(var.global_shape[0])}")
    entry = fmt.check_against_manifest(ckpt.path, table, manifest, files, dim)
    crc32 = entry.crc32 if entry is not None else {}
    return {"files": files, "rows": rows, "dim": dim, "slots": slots, "layout": layout, "crc32": crc32}


def _stage(var: Any, plan: dict, rank: int, n: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Read one table's files once, checking each against its checksum as it is read, and keep the
    rows this rank owns: ``(keys [m], [weights [m, dim], slot 1 [m, its width], ...])``.

    Memory: this rank's share of the table's files (all of them when it owns every row: read
    straight into place, no copies), held until it is assigned; the assigned bytes are the
    verified ones. Raises CheckpointError naming the file.

    This is the path of static tables and of dynamic tables that hold rows (or are widened for
    optimizer columns) when the load starts: their rows are assigned only after every file of the
    checkpoint is verified, so a bad file leaves them as they were. A dynamic table that is empty
    when the load starts takes :func:`_fill_while_reading` instead: its own table is the staging
    area (emptied again on failure). A separate staging table of the same backend, filled while
    reading and swapped in once verified, measured slower than inserting afterwards, because a
    fresh table pays a page fault per 4 KiB of its rows and rehashes as it grows, while the
    variable's own table has its initial capacity already touched.
    """
    keys, select = _owned_keys(var, plan, rank, n)
    arrays = [
        fmt.read_payload(info, plan["rows"], _expected_crc(plan, info), select).reshape(-1, width)
        for info, width in zip(plan["files"][1:], plan["layout"].part_widths, strict=True)
    ]
    return keys, arrays


def _expected_crc(plan: dict, info: fmt.FileInfo) -> str | None:
    """The manifest's checksum of a planned file, or None (no manifest)."""
    return plan["crc32"].get(os.path.basename(info.path))


def _owned_keys(var: Any, plan: dict, rank: int, n: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Read and check a table's key file: ``(the keys this rank owns, select)``, select being the
    ``bool [rows]`` mask of them among the file's rows, or None when it owns them all."""
    key_info = plan["files"][0]
    keys = fmt.read_payload(key_info, plan["rows"], _expected_crc(plan, key_info)).reshape(-1)
    if isinstance(var, DynamicVariable):
        _check_key_range(var, keys, key_info.path)
    else:
        _check_static_keys(var, keys, key_info.path)
    mine = _owned(keys, var, rank, n)
    return (keys, None) if mine.all() else (keys[mine], mine)


def _clear(filled: list[DynamicVariable], cause: BaseException) -> None:
    """Empty again the tables a failed load filled while reading (they were empty before).

    Raises:
        TableNotRestored: a table could not be emptied (the others are emptied first); names the
            tables, their errors and ``cause``, the load's failure.
    """
    failures = []
    for var in filled:
        try:
            var.storage.clear()
        except Exception as error:  # clear the others first
            failures.append((var.name, error))
    if failures:
        listed = "; ".join(f"{name}: {type(error).__name__}: {error}" for name, error in failures)
        raise TableNotRestored(
            f"sok.load failed ({type(cause).__name__}: {cause}) and could not empty again the table(s) it had "
            f"filled ({listed}); they hold part of the checkpoint. Recreate those variables, then load again"
        ) from failures[0][1]


def _fills_while_reading(var: Any, slots: list[str], wrapper: OptimizerWrapper | None) -> bool:
    """Whether ``var`` is filled while its files are read (:func:`_fill_while_reading`): a dynamic
    table that is empty on this rank and already has the columns of every file to load."""
    if not isinstance(var, DynamicVariable) or var.storage.size() != 0:
        return False
    return not slots or var.optimizer_wrapper is wrapper


def _fill_while_reading(var: DynamicVariable, plan: dict, rank: int, n: int) -> None:
    """Insert the rows this rank owns into ``var``'s (empty) table while its files are read.

    The key file is read and verified first; then the weight file and each slot file are streamed
    (:func:`~sparse_operation_kit.checkpoint.format.stream_payload`): a worker thread inserts each chunk's rows into the
    file's columns (``storage.insert_or_assign`` releases the GIL) while the next chunk is read and
    checksummed. Memory: the keys and two chunks per file. The inserted rows are verified only
    when their file's last chunk is: :func:`load` clears the table when anything fails.

    Raises:
        CheckpointError: a file is truncated or does not match its checksum; it names the file.
    """
    keys, select = _owned_keys(var, plan, rank, n)
    keys = keys.astype(var.key_type.as_numpy_dtype, copy=False)
    storage, layout = var.storage, plan["layout"]
    for columns, info in zip(layout.parts, plan["files"][1:], strict=True):

        def insert(first: int, block: np.ndarray, columns: tuple[int, int] = columns) -> None:
            storage.insert_or_assign(keys[first : first + block.shape[0]], block, columns=columns)

        fmt.stream_payload(info, plan["rows"], insert, _expected_crc(plan, info), select)


def _check_key_range(var: DynamicVariable, keys: np.ndarray, path: str) -> None:
    """Every key of the file must fit ``var``'s key type (no key may fold into another)."""
    target = var.key_type.as_numpy_dtype
    if not keys.size or np.can_cast(keys.dtype, target, casting="safe"):
        return
    info = np.iinfo(target)
    if keys.dtype.kind == "u":  # unsigned keys: only too large ones do not fit (info.max >= 0)
        outside = keys > np.uint64(info.max)
    else:  # signed keys: too small ones; too large ones where the target's range is narrower
        outside = keys < info.min
        if info.max <= np.iinfo(np.int64).max:
            outside |= keys > info.max
    if outside.any():
        first = keys[np.argmax(outside)].item()
        fits = "uint64" if keys.dtype == np.uint64 else "int64"
        raise fmt.CheckpointError(
            f"{path} holds key {first} (and {int(outside.sum()) - 1} more) that does not fit the "
            f"{var.key_type.name} keys of {var.name} (valid: {info.min} .. {info.max}); nothing was loaded. "
            f"Load into a DynamicVariable with key_type=tf.{fits}"
        )


def _check_static_keys(var: Any, keys: np.ndarray, path: str) -> None:
    """A static table's file must hold each of its row ids exactly once."""
    global_rows = int(var.global_shape[0])
    k = keys.astype(np.int64, copy=False)
    if k.size and (k.min() < 0 or k.max() >= global_rows):
        raise fmt.CheckpointError(f"{path} has row ids outside [0, {global_rows})")
    seen = np.zeros(global_rows, dtype=bool)
    seen[k] = True
    if not seen.all():
        raise fmt.CheckpointError(f"{path} lacks some rows of {var.name} (or repeats others)")


def load(path: str, load_vars: Any, optimizer: Any = None, callback: Callback | None = None) -> None:
    """Read variables (and optimizer state, with the step counters of the wrapper and of its Keras
    optimizer) from ``path``, whatever world size and layout wrote it.

    All or nothing: every file is read once and checked (headers, sizes, checksums); a problem
    raises CheckpointError naming the file and leaves the variables as they were. Each rank keeps
    the rows it owns under the current world size and layout.

    Two ways in, chosen per table when the load starts:

    * a DynamicVariable whose table is empty on this rank and needs no new optimizer columns (no
      optimizer state to load, or the variable is already attached to ``optimizer``) is filled
      while its files are read: the key file is read and verified first, then each chunk of the
      weight and slot files is inserted by a worker thread while the next chunk is read. If
      anything fails before every file of every table is verified (a bad file of any table, an
      insert's error, KeyboardInterrupt), such tables are cleared again (they were empty) and the
      exception is re-raised;
    * every other table (static ones, dynamic ones that hold rows or are widened for ``optimizer``)
      is read into memory, this rank's share of the checkpoint, and assigned only once every file
      of every table is verified.

    Args:
        path: the checkpoint directory (ours or NVIDIA SOK's).
        load_vars: a variable or a list of them (``sok.Variable``, ``sok.DynamicVariable``).
        optimizer: a ``sok.OptimizerWrapper`` whose state to load, the Keras optimizer it wraps (as
            NVIDIA SOK takes it; see :func:`dump`), or None (weights only).
        callback: progress (two steps per table: read, assign).

    Collective with several ranks: every rank passes the same ``path``; each reads what it needs, and
    the ranks agree that every one of them verified its files before any assigns a row, so a problem
    found on one rank stops the load on all of them (RankFailure, or CheckpointError when it was one,
    on the others).

    A dump of ``path`` (from another process) may run meanwhile: the directory is opened once and
    every file read relative to it, so the rows come from one checkpoint. When that dump deletes the
    directory being read, what this load did is undone and it starts again, at most
    ``checkpoint.directory.READ_ATTEMPTS`` times (each rank on its own). Before any row is assigned, the
    ranks check that they all read the same directory (its inode and its manifest's checksum): if a
    dump replaced it between their reads, every rank undoes what it did and raises
    CheckpointChanged (load again). The progress counts a table's read once (after the read that
    succeeded), whatever the attempts.

    Raises:
        CheckpointError: the ranks passed different paths (on every rank, naming them);
            ``path`` is missing or is a dump's staging directory; the manifest is
            corrupt (any field: it is validated whole before anything is read); a file is missing,
            truncated, corrupt or does not match its variable or the manifest; a key does not fit
            the variable's key type.
        CheckpointChanged: dumps replaced ``path`` during each of its reads; or the ranks read
            different checkpoints (on every rank; nothing was loaded).
        TableNotRestored: a failed attempt could not empty again a table it had filled (fatal, no
            retry; the table holds part of the checkpoint).
        ValueError: a variable holds another wrapper's state, or a static table's optimizer state
            has nowhere to go yet.
    """
    variables = _variables(load_vars)
    wrapper = _optimizer(optimizer, variables)
    comm = communication.tool()
    rank, n = comm.rank(), comm.num_ranks()
    callback = callback or NoOpCallback()
    callback.set_size(2 * len(variables))
    agreement = Agreement(comm, f"sok.load from {path}")
    _check_same_path(agreement, path, "each rank would read its own checkpoint")
    filled: list[DynamicVariable] = []

    def read(ckpt: ckdir.OpenCheckpoint) -> tuple:
        return (ckpt.identity, *_read(ckpt, variables, wrapper, rank, n))

    identity = ""
    try:
        identity, manifest, slot_names, static_state, staged, filled = ckdir.read_consistently(path, read)
    except Exception as error:
        agreement.fail(error)  # raises it with one rank
    try:
        agreement.check()  # every rank verified every file it read, or every rank stops here
        identities = agreement.texts(identity)
        if not ckdir.same_checkpoint(identities):
            raise fmt.CheckpointChanged(
                f"{agreement.call}: the ranks read different checkpoints (directory identities "
                f"{', '.join(f'rank {r}: {i}' for r, i in enumerate(identities))}): a dump replaced it during the "
                f"load; nothing was loaded, load again"
            )
    except BaseException as error:
        _clear(filled, error)
        raise
    callback.relative_update(len(variables))  # the reads, counted once one of them succeeded
    # Every file of every table is verified: assign the staged rows.
    for var, slots, item in zip(variables, slot_names, staged):
        if item is not None:
            keys, arrays = item
            if isinstance(var, DynamicVariable):
                _load_dynamic(var, keys, arrays, slots, wrapper)
            else:
                targets = [var] + [static_state[id(var)][s] for s in slots]
                for target, values in zip(targets, arrays):
                    _load_static(var, target, keys, values, rank, n)
        callback.relative_update(1)
    if wrapper is not None and not wrapper.static_only and manifest is not None and manifest.step is not None:
        wrapper.iterations.assign(manifest.step)
    if wrapper is not None and manifest is not None and manifest.optimizer_step is not None:
        wrapper.optimizer.iterations.assign(manifest.optimizer_step)
    logger.info("SOK load from %s done: %d tables", path, len(variables))


def _read(ckpt: ckdir.OpenCheckpoint, variables: list, wrapper: OptimizerWrapper | None, rank: int, n: int) -> tuple:
    """Read and verify every file of the open checkpoint that :func:`load` needs: returns ``(manifest,
    slot names, static optimizer targets, staged rows (None for a table filled while reading),
    tables filled while reading)``. On any exception (KeyboardInterrupt too) the tables it filled
    are emptied again before it propagates, so it may be called again; when one cannot be emptied,
    :class:`TableNotRestored` propagates instead (never retried)."""
    manifest, plans, slot_names, static_state, streamed = _prepare_load(ckpt, variables, wrapper)
    filled: list[DynamicVariable] = []
    staged: list[tuple[np.ndarray, list[np.ndarray]] | None] = []
    try:
        for var, plan, stream in zip(variables, plans, streamed):
            if stream:
                filled.append(var)
                _fill_while_reading(var, plan, rank, n)
                staged.append(None)
            else:
                staged.append(_stage(var, plan, rank, n))
    except BaseException as error:
        _clear(filled, error)
        raise
    return manifest, slot_names, static_state, staged, filled


def _prepare_load(ckpt: ckdir.OpenCheckpoint, variables: list, wrapper: OptimizerWrapper | None) -> tuple:
    """What :func:`load` checks before reading any row: the manifest, each table's files
    (:func:`_plan`) and where each table's rows go. Returns ``(manifest, plans, slot names, static
    optimizer targets, streamed flags)``; raises CheckpointError / ValueError."""
    manifest = ckpt.manifest
    slot_names = [wrapper.get_slot_names() if wrapper is not None else [] for _ in variables]
    plans = [_plan(ckpt, v, s, wrapper) for v, s in zip(variables, slot_names)]
    slot_names = [plan["slots"] for plan in plans]
    for var, slots in zip(variables, slot_names):
        owner = var.optimizer_wrapper if isinstance(var, DynamicVariable) else None
        if slots and isinstance(var, DynamicVariable) and wrapper.static_only:
            raise ValueError(
                f"the checkpoint holds {wrapper.name} state of the dynamic variable {var.name}, which lives in a "
                f"sok.OptimizerWrapper, and none wraps {type(wrapper.optimizer).__name__}; create it first "
                f"(sok.OptimizerWrapper(optimizer)) and pass it or the optimizer, or load without the optimizer"
            )
        if slots and owner is not None and owner is not wrapper:
            raise ValueError(
                f"{var.name} already has the state of another sok.OptimizerWrapper ({owner.name}); load "
                f"with that wrapper, or into a fresh variable"
            )
    static_state = {id(v): _static_targets(v, slots, wrapper) for v, slots in zip(variables, slot_names)}
    streamed = [_fills_while_reading(v, slots, wrapper) for v, slots in zip(variables, slot_names)]
    return manifest, plans, slot_names, static_state, streamed


def _static_targets(var: Any, slots: list[str], wrapper: OptimizerWrapper | None) -> dict[str, Any]:
    """The optimizer variables that receive a static table's saved state (checked before loading)."""
    if isinstance(var, DynamicVariable) or not slots:
        return {}
    state = wrapper.static_slots(var, create=True)
    if set(state) != set(slots):
        raise ValueError(
            f"the checkpoint holds {wrapper.name} state {slots} of static table {var.name}, but the wrapped "
            f"optimizer has no state for it yet; build it first (optimizer.build(model.trainable_variables), "
            f"or one training step), or load without the optimizer to restore weights only"
        )
    return state


def _owned(keys: np.ndarray, var: Any, rank: int, n: int) -> np.ndarray:
    """``bool [len(keys)]``: the rows of ``var`` that this rank holds under the current layout."""
    target = -1 if isinstance(var, DistributedVariable) else var.target_gpu
    if target >= 0:
        return np.full(keys.shape, rank == target)
    return np.mod(keys.astype(np.int64) if keys.dtype != np.uint64 else keys.view(np.int64), n) == rank


def _load_dynamic(
    var: DynamicVariable,
    keys: np.ndarray,
    arrays: Sequence[np.ndarray],
    slots: list[str],
    wrapper: OptimizerWrapper | None,
) -> None:
    """Insert this rank's staged rows (weights, then each slot's columns)."""
    keys = keys.astype(var.key_type.as_numpy_dtype, copy=False)
    if slots:
        wrapper.attach(var)
    storage = var.table_ref.storage
    for columns, values in zip(_layout(var.dimension, slots, wrapper).parts, arrays, strict=True):
        if keys.size:
            storage.insert_or_assign(keys, values, columns=columns)


def _load_static(var: Any, target: Any, keys: np.ndarray, weights: np.ndarray, rank: int, n: int) -> None:
    """Assign this rank's staged rows of a static table (or of its optimizer state ``target``), by key."""
    if isinstance(var, LocalizedVariable) and rank != var.target_gpu:
        return
    local = keys.astype(np.int64) if isinstance(var, LocalizedVariable) else keys.astype(np.int64) // n
    value = np.empty(tuple(target.shape), dtype=np.float32)  # a per-row slot: [rows, 1]
    value[local] = weights
    target.assign(tf.cast(value, target.dtype))  # half-width rows: rounded to nearest even (exact if dumped so)


def incremental_model_dump(sok_vars: Any, time_threshold: Any, sess: Any = None) -> tuple[list, list]:
    """Rows of dynamic variables written after ``time_threshold``, gathered to every rank.

    Args:
        sok_vars: a DynamicVariable or a list of them (either backend).
        time_threshold: a ``datetime.datetime`` (a naive one is local time, as ``datetime.timestamp``
            reads it; pass an aware one to be sure), or a list with one per variable. Rows count as
            changed when their score, the host clock in ns since the Unix epoch at their last write
            or lookup, is at or after it.
        sess: TF1 only; must be None.

    Returns:
        ``(keys_list, values_list)``: per variable, ``np.ndarray [K]`` and ``[K, dim]``, rank by rank.
    """
    if sess is not None:
        raise ValueError("sess is a TensorFlow 1 argument; TensorFlow 2 needs none")
    variables = list(sok_vars) if isinstance(sok_vars, (list, tuple)) else [sok_vars]
    for i, v in enumerate(variables):
        if not isinstance(v, DynamicVariable):
            raise TypeError(f"variable {i} is a {type(v).__name__}; incremental_model_dump takes sok.DynamicVariable")
    thresholds = list(time_threshold) if isinstance(time_threshold, (list, tuple)) else [time_threshold]
    if len(thresholds) not in (1, len(variables)):
        raise ValueError(f"time_threshold has {len(thresholds)} entries; give 1 or one per variable ({len(variables)})")
    if len(thresholds) == 1:
        thresholds *= len(variables)
    comm = communication.tool()
    keys_list, values_list = [], []
    for var, when in zip(variables, thresholds):
        if not isinstance(when, dt.datetime):
            raise TypeError(f"time_threshold must be a datetime.datetime, got {type(when).__name__}")
        ns = max(0, int(when.timestamp() * 1e9))
        keys, values, _ = var.storage.export_if(ns, columns=RowLayout(var.dimension).embedding)
        if comm.num_ranks() > 1:
            keys = comm.allgather(tf.constant(keys)).numpy()
            values = comm.allgather(tf.constant(values.reshape(-1, var.dimension))).numpy()
        keys_list.append(keys)
        values_list.append(values)
    return keys_list, values_list
