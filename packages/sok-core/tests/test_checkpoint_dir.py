"""checkpoint_dir's swap, dump lock and readers, with real files and no TensorFlow: a reader between
the two renames of a swap, the dump lock file (symbolic links refused, kept after release), and
symbolic links inside a checkpoint."""

from __future__ import annotations

import os
import shutil
import threading

import pytest
from sparse_operation_kit.checkpoint import directory as ckdir
from sparse_operation_kit.checkpoint import format as fmt


def write_checkpoint(path: str, step: int) -> None:
    """A (table-less) checkpoint whose manifest says ``step``, put in place as sok.dump does."""
    with ckdir.Staging(path) as staging:
        fmt.write_manifest(staging.directory, fmt.Manifest(world_size=1, step=step))
        staging.swap_into_place()


def read_step(path: str) -> int:
    return ckdir.read_consistently(path, lambda ckpt: ckpt.manifest.step)


def test_a_reader_between_the_two_renames_of_a_swap_retries_and_reads_the_new_checkpoint(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt")
    write_checkpoint(path, 1)
    monkeypatch.setattr(ckdir, "_exchange", lambda a, b: False)  # a file system that cannot exchange
    real_rename, seen = os.rename, {}

    def rename(src, dst):
        real_rename(src, dst)
        if dst.endswith(".old"):  # the first rename: path is missing until the second one
            try:
                ckdir.OpenCheckpoint(path)
            except fmt.CheckpointError as error:
                seen["error"] = error
            reader = threading.Thread(target=lambda: seen.setdefault("step", read_step(path)))
            reader.start()
            reader.join(0.02)  # its first attempts find path missing
            seen["reader"] = reader

    monkeypatch.setattr(ckdir.os, "rename", rename)
    write_checkpoint(path, 2)
    monkeypatch.setattr(ckdir.os, "rename", real_rename)
    seen["reader"].join(10)
    assert isinstance(seen["error"], fmt.CheckpointChanged), seen["error"]
    assert "rename it to" not in str(seen["error"])
    assert seen["step"] == 2


def crashed_between_renames(tmp_path) -> str:
    """path missing, the previous checkpoint set aside beside it (a dump killed between its renames)."""
    path = str(tmp_path / "ckpt")
    write_checkpoint(path, 1)
    os.rename(path, str(tmp_path / ".ckpt.sok-tmp-abcd.old"))
    return path


def test_leftovers_of_a_crashed_dump_are_named_with_the_rename_advice_after_the_last_attempt(tmp_path):
    path = crashed_between_renames(tmp_path)
    with pytest.raises(fmt.CheckpointError, match=r"no checkpoint directory at .* rename it to") as raised:
        read_step(path)
    assert not isinstance(raised.value, fmt.CheckpointChanged)


def test_no_rename_advice_while_a_dump_holds_the_lock(tmp_path):
    path = crashed_between_renames(tmp_path)
    with ckdir.dump_lock(path), pytest.raises(fmt.CheckpointChanged) as raised:
        read_step(path)
    assert "rename it to" not in str(raised.value) and "sok.dump of it is running" in str(raised.value)


def test_no_rename_advice_while_a_dump_writes_its_staging_directory(tmp_path):
    path = str(tmp_path / "ckpt")
    with ckdir.Staging(path), pytest.raises(fmt.CheckpointChanged, match="sok.dump of it is running"):
        read_step(path)


def test_dump_lock_refuses_a_symbolic_link_and_keeps_its_target(tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    (tmp_path / ".ckpt.sok-lock").symlink_to(target)
    with pytest.raises(fmt.CheckpointError, match=r"\.ckpt\.sok-lock, the dump lock file .* is not a regular file"):
        with ckdir.dump_lock(str(tmp_path / "ckpt"), wait_s=1):
            pass
    assert target.read_text() == "keep me"


def test_dump_lock_refuses_a_directory_at_the_lock_path(tmp_path):
    (tmp_path / ".ckpt.sok-lock").mkdir()
    with pytest.raises(fmt.CheckpointError, match=r"\.ckpt\.sok-lock, the dump lock file .* is not a regular file"):
        with ckdir.dump_lock(str(tmp_path / "ckpt"), wait_s=1):
            pass


def test_dump_lock_file_is_kept_after_release(tmp_path):
    with ckdir.dump_lock(str(tmp_path / "ckpt")):
        pass
    assert (tmp_path / ".ckpt.sok-lock").is_file()
    with ckdir.dump_lock(str(tmp_path / "ckpt"), wait_s=1):  # and locks again
        pass


def test_a_symbolic_link_inside_a_checkpoint_is_refused(tmp_path):
    path = str(tmp_path / "ckpt")
    write_checkpoint(path, 1)
    os.rename(os.path.join(path, fmt.MANIFEST), str(tmp_path / "elsewhere.json"))
    os.symlink(str(tmp_path / "elsewhere.json"), os.path.join(path, fmt.MANIFEST))
    with pytest.raises(fmt.CheckpointError, match="not a regular file"):
        read_step(path)


def test_a_dangling_symbolic_link_inside_a_checkpoint_is_refused(tmp_path):
    path = str(tmp_path / "ckpt")
    write_checkpoint(path, 1)
    os.remove(os.path.join(path, fmt.MANIFEST))
    os.symlink(str(tmp_path / "nowhere.json"), os.path.join(path, fmt.MANIFEST))
    with pytest.raises(fmt.CheckpointError, match="not a regular file"):
        read_step(path)


def test_old_checkpoints_and_leftovers_are_deleted_after_the_dump_lock_is_released(tmp_path, monkeypatch):
    path = str(tmp_path / "ckpt")
    write_checkpoint(path, 1)
    os.mkdir(str(tmp_path / ".ckpt.sok-tmp-dead"))  # a crashed dump's staging directory
    real_rmtree, deleted = ckdir.shutil.rmtree, []

    def rmtree(target, *args, **kwargs):
        deleted.append((os.path.basename(target), ckdir._locked(ckdir._lock_path(path))))
        return real_rmtree(target, *args, **kwargs)

    monkeypatch.setattr(ckdir.shutil, "rmtree", rmtree)
    write_checkpoint(path, 2)
    assert [name for name, _ in deleted][:1] == [".ckpt.sok-tmp-dead"] and len(deleted) == 2
    assert not any(held for _, held in deleted), deleted  # the lock was free at each deletion
    assert ckdir.leftovers(path) == [] and read_step(path) == 2


def test_the_identity_tells_a_copy_from_the_checkpoint_across_hosts_by_inode_and_manifest(tmp_path):
    path = str(tmp_path / "ckpt")
    write_checkpoint(path, 1)
    shutil.copytree(path, str(tmp_path / "copy"))
    with ckdir.open_for_reading(path) as a, ckdir.open_for_reading(path) as b:
        with ckdir.open_for_reading(str(tmp_path / "copy")) as copy:
            assert ckdir.same_checkpoint([a.identity, b.identity])
            assert not ckdir.same_checkpoint([a.identity, copy.identity])
    host, device, inode, crc = a.identity.split(" ")
    # Another host mounts the same directory under another device number: still the same checkpoint.
    assert ckdir.same_checkpoint([a.identity, f"{host}-other 99 {inode} {crc}"])
    assert not ckdir.same_checkpoint([a.identity, f"{host} 99 {inode} {crc}"])
