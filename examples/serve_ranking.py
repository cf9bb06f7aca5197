"""Serve the ranking model: raw click rows -> NVTabular workflow -> the exported model, as a
Merlin Systems ensemble run in this process; checked against ``model.predict`` on the
workflow's output, then exported as a Triton model repository.

    python examples/serve_ranking.py OUT/clicks MODEL_DIR RAW_DIR/clicks/valid.parquet \
        [--triton OUT/triton_ranking]

MODEL_DIR: what ``model.save`` wrote (e.g. the DLRM command's ``--export``).
"""

import argparse
import time

import numpy as np
import pandas as pd


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("clicks_dir", help="examples/preprocess.py's OUT/clicks")
    parser.add_argument("model_dir")
    parser.add_argument("raw_rows", help="raw click rows (parquet)")
    parser.add_argument("--label", default="click")
    parser.add_argument("--triton", help="write the Triton model repository here")
    args = parser.parse_args(argv)

    import merlin.models.tf as mm
    from merlin.io import Dataset

    from merlin_models_de import load_model, ranking_ensemble
    from merlin_models_de.serving.ensemble import column_array, serving_workflow

    start = time.perf_counter()
    ensemble = ranking_ensemble(
        f"{args.clicks_dir}/workflow", args.model_dir, label_columns=[args.label]
    )
    raw = pd.read_parquet(args.raw_rows).drop(columns=[args.label], errors="ignore")
    built = time.perf_counter()
    (name,) = ensemble.output_schema.column_names
    served = column_array(ensemble.transform(raw), name).reshape(-1)
    served_at = time.perf_counter()
    print(
        f"ensemble built in {built - start:.1f} s; {len(raw)} raw rows served in "
        f"{served_at - built:.2f} s"
    )

    # the same rows through the workflow, then model.predict
    workflow = serving_workflow(f"{args.clicks_dir}/workflow", [args.label])
    features = workflow.transform(Dataset(raw))
    model = load_model(args.model_dir)
    want = model.predict(mm.Loader(features, batch_size=1024, shuffle=False), verbose=0)
    if isinstance(want, dict):  # Merlin predicts {task: scores}
        (want,) = want.values()
    want = np.asarray(want).reshape(-1)
    print(
        f"max |served - model.predict| = {np.max(np.abs(served - want)):.3g} "
        f"over {len(want)} rows"
    )
    if args.triton:
        ensemble.export(args.triton)
        print(f"Triton model repository in {args.triton}")


if __name__ == "__main__":
    main()
