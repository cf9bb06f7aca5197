"""What outlives a process: sharded checkpoints (:mod:`.checkpoint`, their files
:mod:`.files` and the model state they hold :mod:`.state`), the block inside Keras checkpoints
and SavedModels (:mod:`.keras_checkpoint`), the single-process export (:mod:`.export`) and
one table written by every rank in parallel (:mod:`.table_export`)."""
