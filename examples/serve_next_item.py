"""Serve the next-item model as retrieval: raw session events -> NVTabular workflow -> the
query side of the model -> a Faiss index of the item table -> the top-k item ids; checked
against the trained model's own top-k.

    python examples/serve_next_item.py OUT/sessions RAW_DIR/events/valid.parquet [--k 10]

Reads OUT/sessions/model and OUT/sessions/items (examples/train_next_item.py); writes
OUT/sessions/query (the query side) and OUT/sessions/items.faiss.
"""

import argparse
import time

import numpy as np
import pandas as pd


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("sessions_dir")
    parser.add_argument("raw_events", help="raw session events (parquet)")
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument(
        "--batch-rows",
        type=int,
        default=65536,
        help="table rows read and added to the index at a time",
    )
    parser.add_argument("--triton", help="write the Triton model repository here")
    args = parser.parse_args(argv)

    import merlin.models.tf  # noqa: F401  (first: it attaches the package's layers)
    import tensorflow as tf
    from merlin.io import Dataset

    from merlin_models_de import (
        build_faiss_index,
        load_model,
        retrieval_ensemble,
        save_query_model,
        top_k_model,
    )
    from merlin_models_de.apps.next_item.data import item_sequence_column
    from merlin_models_de.serving.ensemble import column_array, load_workflow

    d = args.sessions_dir
    start = time.perf_counter()
    model = load_model(f"{d}/model")
    save_query_model(model, f"{d}/query", f"{d}/workflow")
    rows = build_faiss_index(f"{d}/items", f"{d}/items.faiss", batch_rows=args.batch_rows)
    ensemble = retrieval_ensemble(f"{d}/workflow", f"{d}/query", f"{d}/items.faiss", k=args.k)
    built = time.perf_counter()
    events = pd.read_parquet(args.raw_events)
    served = column_array(ensemble.transform(events), "candidate_ids").reshape(-1, args.k)
    served_at = time.perf_counter()
    print(
        f"query side + index of {rows} items + ensemble in {built - start:.1f} s; "
        f"{len(events)} raw events ({len(served)} sessions) served in "
        f"{served_at - built:.2f} s"
    )

    workflow = load_workflow(f"{d}/workflow")
    item, _ = item_sequence_column(workflow.output_schema, "sessions_dir", d)
    sessions = workflow.transform(Dataset(events)).to_ddf().compute()
    seq = tf.ragged.constant(sessions[item].tolist(), dtype=tf.int64)
    _, want = top_k_model(model, k=args.k)(
        {f"{item}__values": seq.flat_values, f"{item}__offsets": seq.row_splits}
    )
    same = float(np.mean(served == want.numpy()))
    print(f"top-{args.k} ids equal to the model's own top-k: {same:.1%} of positions")
    if args.triton:
        ensemble.export(args.triton)
        print(f"Triton model repository in {args.triton}")


if __name__ == "__main__":
    main()
