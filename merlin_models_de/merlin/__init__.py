"""Merlin Models integration: ``mm.DistributedEmbeddings`` registration and the hook
installation that follows Merlin's import (:mod:`.register`), what changes in Merlin's
compile / fit / evaluate / predict / save for models with the block (:mod:`.hooks`), and the
custom-loop helpers (:mod:`.training`)."""
