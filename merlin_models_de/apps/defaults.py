"""Values the applications share, defined once."""

OPTIMIZERS = ("sgd", "adagrad", "adam")
# per-rank learning rate by optimizer (Merlin multiplies it by the world size)
LEARNING_RATES = {"sgd": 0.05, "adagrad": 0.05, "adam": 0.001}
