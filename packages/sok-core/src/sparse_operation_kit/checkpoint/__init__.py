"""SOK's checkpoints, a module each (``sok.dump`` and ``sok.load`` are :mod:`.collective`'s):

- :mod:`.collective`: ``sok.dump`` / ``sok.load`` (collective, resharding) and
  ``sok.incremental_model_dump``;
- :mod:`.format`: the files on disk (headers, chunks, checksums, the manifest) and the format's
  version;
- :mod:`.directory`: where a checkpoint lives, the atomic swap of a new one, the dump lock and
  consistent reads;
- :mod:`.inspect`: what a checkpoint holds, read without TensorFlow (``sok ckpt inspect``).

Importing this package imports none of them (``sok ckpt inspect`` never imports TensorFlow, which
:mod:`.collective` needs).

Example::

    from sparse_operation_kit.checkpoint import format as fmt
    header = fmt.read_header("ckpt/table-key")
"""
