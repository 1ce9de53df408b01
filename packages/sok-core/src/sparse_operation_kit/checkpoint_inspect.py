"""What a checkpoint directory holds, checked without loading it: ``sok ckpt inspect``.

Read-only and free of TensorFlow: it reads the manifest and the files' headers (and, to verify the
checksums, the files) through :mod:`~sparse_operation_kit.checkpoint_format` and
:mod:`~sparse_operation_kit.checkpoint_dir`, and never renames, deletes or writes anything. What an
interrupted ``sok.dump`` left beside the checkpoint is reported as it is found; the next
``sok.dump`` of the same path deletes it.

Example::

    info = inspect("ckpt")
    info["tables"]["emb_0"]      # {"rows": 8, "dim": 4, "key_dtype": "int64", "state_files": [...]}
    info["checksums"]            # "verified"
"""

from __future__ import annotations

import os
from typing import Any

from sparse_operation_kit import checkpoint_dir as ckdir
from sparse_operation_kit import checkpoint_format as fmt

__all__ = ["inspect"]


def inspect(path: str, verify: bool = True) -> dict[str, Any]:
    """What a checkpoint directory holds, per table: rows, dim, dtypes, optimizer slots. Checks what
    a load checks before reading rows (the manifest whole, each table's files against each other and
    against the manifest); with ``verify``, also the manifest's checksums.

    Args:
        path: the checkpoint directory (ours or NVIDIA SOK's).
        verify: also read every file and compare its CRC-32 with the manifest's.

    Returns:
        ``{"path", "manifest" (as ``manifest.json`` holds it; None: NVIDIA SOK's layout), "tables":
        {table: {rows, dim, key_dtype, state_files}}, "checksums": "verified" | "not checked" | "not
        available", "leftovers": [{path, complete}: what interrupted (or running) dumps of ``path``
        left beside it, which the next ``sok.dump`` of it deletes]}``.

    Raises:
        CheckpointError: as :func:`sparse_operation_kit.load`'s checks (``path`` missing, with the
            leftovers named, or a dump's staging directory included), or the directory holds no
            table.

    Example::

        >>> inspect("ckpt", verify=False)["tables"]
        {'emb_0': {'rows': 8, 'dim': 4, 'key_dtype': 'int64', 'state_files': ['emb_0-Adagrad-accumulator']}}
    """
    manifest = ckdir.open_checkpoint(path)
    tables: dict[str, dict[str, Any]] = {}
    for name in sorted(os.listdir(path)):
        if not name.endswith("-key"):
            continue
        table = name[: -len("-key")]
        key_info, weight_info, rows = fmt.table_files(path, table)
        dim = weight_info.elements // rows if rows else None
        states = sorted(
            n for n in os.listdir(path) if n.startswith(f"{table}-") and n not in (name, fmt.weight_file(table))
        )
        infos = [key_info, weight_info]
        for state in states:
            info = fmt.read_header(os.path.join(path, state))
            if info.elements != weight_info.elements or info.dtype != "float32":
                raise fmt.CheckpointError(
                    f"{info.path} holds {info.elements} {info.dtype} values; expected {rows} x {dim} float32 "
                    f"as {weight_info.path}"
                )
            infos.append(info)
        fmt.check_against_manifest(path, table, manifest, infos, dim or 0)
        tables[table] = {"rows": rows, "dim": dim, "key_dtype": key_info.dtype, "state_files": states}
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
                if fmt.crc32(os.path.join(path, name)) != digest:
                    raise fmt.CheckpointError(
                        f"{os.path.join(path, name)} does not match its checksum: the file is corrupt"
                    )
    return {
        "path": path,
        "manifest": None if manifest is None else manifest.to_dict(),
        "tables": tables,
        "checksums": checksums,
        "leftovers": [{"path": p, "complete": ckdir.is_complete(p)} for p in ckdir.leftovers(path)],
    }
