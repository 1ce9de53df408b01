"""What a checkpoint directory holds, checked without loading it: ``sok ckpt inspect``.

Read-only and free of TensorFlow: it reads the manifest and the files' headers (and, to verify the
checksums, the files) through :mod:`~sparse_operation_kit.checkpoint.format` and
:mod:`~sparse_operation_kit.checkpoint.directory`, and never renames, deletes or writes anything. What an
interrupted ``sok.dump`` left beside the checkpoint is reported as it is found; the next
``sok.dump`` of the same path deletes it. The directory is opened once and every file read relative
to it, so a dump that replaces the checkpoint meanwhile never makes a good checkpoint look corrupt
(the inspection starts again instead, :func:`~sparse_operation_kit.checkpoint.directory.read_consistently`);
table and file names stay inside the directory (:func:`~sparse_operation_kit.checkpoint.format.check_name`).

Example::

    info = inspect("ckpt")
    info["tables"]["emb_0"]      # {"rows": 8, "dim": 4, "key_dtype": "int64", "dtype": "float32", "state_files": [...]}
    info["checksums"]            # "verified"
"""

from __future__ import annotations

import os
from typing import Any

from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt

__all__ = ["describe", "inspect"]


def inspect(path: str, verify: bool = True) -> dict[str, Any]:
    """What a checkpoint directory holds, per table: rows, dim, dtypes, optimizer slots. Checks what
    a load checks before reading rows (the manifest whole, each table's files against each other and
    against the manifest); with ``verify``, also the manifest's checksums.

    Args:
        path: the checkpoint directory (ours or NVIDIA SOK's).
        verify: also read every file and compare its CRC-32 with the manifest's.

    Returns:
        ``{"path", "manifest" (as ``manifest.json`` holds it; None: NVIDIA SOK's layout), "tables":
        {table: {rows, dim, key_dtype, dtype (the table's row dtype: the manifest's, float32 without
        one), state_files}}, "checksums": "verified" | "not checked" | "not
        available", "leftovers": [{path, complete}: what interrupted (or running) dumps of ``path``
        left beside it, which the next ``sok.dump`` of it deletes]}``.

    Raises:
        CheckpointError: as :func:`sparse_operation_kit.load`'s checks (``path`` missing, with the
            leftovers named, or a dump's staging directory included; a table or file name that is not
            a plain name), or the directory holds no table.
        CheckpointChanged: dumps replaced ``path`` during each of its reads.

    Example::

        >>> inspect("ckpt", verify=False)["tables"]
        {'emb_0': {'rows': 8, 'dim': 4, 'key_dtype': 'int64', 'dtype': 'float32', 'state_files': [...]}}
    """
    return ckdir.read_consistently(path, lambda ckpt: describe(ckpt, verify))


def describe(ckpt: ckdir.OpenCheckpoint, verify: bool = True) -> dict[str, Any]:
    """:func:`inspect` of a checkpoint opened with :func:`~sparse_operation_kit.checkpoint.directory.open_for_reading`
    (to read its files afterwards through the same handle, as ``sok ckpt convert`` does).

    Example::

        with ckdir.open_for_reading("ckpt") as ckpt:
            tables = describe(ckpt)["tables"]
    """
    manifest, path, names = ckpt.manifest, ckpt.path, sorted(ckpt.listdir())
    tables: dict[str, dict[str, Any]] = {}
    for name in names:
        if not name.endswith("-key"):
            continue
        table = name[: -len("-key")]
        key_info, weight_info, rows = ckpt.table_files(table)
        dim = weight_info.elements // rows if rows else None
        states = [n for n in names if n.startswith(f"{table}-") and n not in (name, fmt.weight_file(table))]
        infos = [key_info, weight_info]
        for state in states:
            info = ckpt.read_header(state)
            # one float per column as the weights, or one per row (sok.RowWiseAdagrad's accumulator)
            if info.elements not in (weight_info.elements, rows) or info.dtype != "float32":
                raise fmt.CheckpointError(
                    f"{info.path} holds {info.elements} {info.dtype} values; expected {rows} x {dim} float32 "
                    f"as {weight_info.path}, or {rows} x 1 (a per-row slot)"
                )
            infos.append(info)
        fmt.check_against_manifest(path, table, manifest, infos, dim or 0)
        entry = None if manifest is None else manifest.tables.get(table)
        row_dtype = weight_info.dtype if entry is None else entry.dtype  # half rows are written widened
        tables[table] = {
            "rows": rows,
            "dim": dim,
            "key_dtype": key_info.dtype,
            "dtype": row_dtype,
            "state_files": states,
        }
    if not tables:
        raise fmt.CheckpointError(f"{path} holds no checkpoint table (no <table>-key file): it is not a checkpoint")
    if manifest is not None and set(manifest.tables) - set(tables):
        raise fmt.CheckpointError(
            f"{os.path.join(path, fmt.MANIFEST)} lists tables whose files are missing: "
            f"{sorted(set(manifest.tables) - set(tables))}"
        )
    checksums = "not available" if manifest is None else "verified" if verify else "not checked"
    if verify and manifest is not None:
        for entry in manifest.tables.values():
            for name, digest in entry.crc32.items():
                if ckpt.crc32(name) != digest:
                    raise fmt.CheckpointError(f"{ckpt.file(name)} does not match its checksum: the file is corrupt")
    return {
        "path": path,
        "manifest": None if manifest is None else manifest.to_dict(),
        "tables": tables,
        "checksums": checksums,
        "leftovers": [{"path": p, "complete": ckdir.is_complete(p)} for p in ckdir.leftovers(path)],
    }
