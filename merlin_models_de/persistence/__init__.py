"""What outlives a process.

Below: :mod:`.io` (files written whole and flushed, read back checked; the one error type
``StorageError``), :mod:`.disk` (free space, write errors), :mod:`.layout` (a checkpoint's
names and ``latest``), :mod:`.manifest` (what a checkpoint holds, checked),
:mod:`.retention` (which checkpoints stay), :mod:`.state` (what a model's state is).
On top: sharded checkpoints (:mod:`.checkpoint` saves, :mod:`.restore` reads, :mod:`.lock`
keeps one writer per directory), the block inside Keras checkpoints and SavedModels
(:mod:`.keras_checkpoint`), the single-process export (:mod:`.export`) and one table written
by every rank in parallel (:mod:`.table_export`)."""
