"""``fit`` / ``evaluate`` / ``predict``'s arguments on several ranks, before the first step.

Bound by name (what the call gave, defaults left out), the arguments are checked and
adjusted once, on every rank:

- every input the call reads is counted and the ranks compare counts (:mod:`.batches`):
  ``fit``'s ``x`` (after ``validation_split``) and ``validation_data`` (or the split's
  rows), ``evaluate`` / ``predict``'s ``x``; inputs whose length only reading tells end on
  every rank together (:mod:`.ending`);
- ``verbose`` is 0 on ranks other than 0 unless the call gives it (as Merlin's own ``fit``
  does): one progress bar, rank 0's;
- ``fit`` drops the validation data an earlier ``fit`` that raised left on the model;
- ``evaluate`` and ``predict`` report the ids outside their tables of blocks with
  ``validate_ids=False`` (:mod:`.id_report`; ``fit`` adds the report with Merlin's
  callbacks).

``evaluate`` as ``fit`` calls it for validation (Keras' cached validation data) is left as
it is: ``fit`` checked that data before its first step, and its callbacks already report.

Example:
    >>> arguments = prepare_call(model, "fit", bound.arguments)  # doctest: +SKIP
"""

from __future__ import annotations

from merlin_models_de import comm
from merlin_models_de.compat import keras as keras_compat
from merlin_models_de.merlin.batches import check_counts
from merlin_models_de.merlin.ending import ending_together, needs_agreement
from merlin_models_de.merlin.id_report import report_for


def call_inputs(method: str, arguments) -> list:
    """``[(argument, data, batch_size, split, steps, the steps' argument)]``: what the call
    reads, as :func:`.batches.check_counts` takes it."""
    x, y, weights = (arguments.get(k) for k in ("x", "y", "sample_weight"))
    data = x if y is None and weights is None else (x, y, weights)  # y: arrays only
    size = arguments.get("batch_size")
    if method != "fit":
        return [("x", data, size, None, arguments.get("steps"), "steps")]
    split = arguments.get("validation_split") or None
    inputs = [
        (
            "x",
            data,
            size,
            split and (split, "train"),
            arguments.get("steps_per_epoch"),
            "steps_per_epoch",
        )
    ]
    validation_size = arguments.get("validation_batch_size") or size
    steps = arguments.get("validation_steps")
    if arguments.get("validation_data") is not None:
        inputs.append(
            (
                "validation_data",
                arguments["validation_data"],
                validation_size,
                None,
                steps,
                "validation_steps",
            )
        )
    elif split:
        inputs.append(
            (
                "validation_split",
                data,
                validation_size,
                (split, "validation"),
                steps,
                "validation_steps",
            )
        )
    return inputs


def prepare_call(model, method: str, arguments):
    """``arguments`` (a call's arguments by name, a mutable mapping) checked and adjusted
    as the module says; returns them."""
    if method == "evaluate" and (arguments.get("kwargs") or {}).get("_use_cached_eval_dataset"):
        return arguments
    if method == "fit":
        keras_compat.forget_validation_data(model)
    if "verbose" not in arguments and comm.rank() != 0:
        arguments["verbose"] = 0
    check_counts(method, call_inputs(method, arguments))
    for argument in ("x", "validation_data"):
        if needs_agreement(arguments.get(argument)):
            arguments[argument] = ending_together(method, argument, arguments[argument])
    report = report_for(model) if method != "fit" else None
    if report is not None:
        given = arguments.get("callbacks")
        given = (
            [] if given is None else list(given) if isinstance(given, (list, tuple)) else [given]
        )
        arguments["callbacks"] = given + [report]
    return arguments


__all__ = ["call_inputs", "prepare_call"]
