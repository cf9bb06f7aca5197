"""NVTabular workflows from the raw rows of examples/raw_data.py to what the block trains on.

    python examples/preprocess.py RAW_DIR OUT_DIR [--partitions 2]

Click log -> OUT_DIR/clicks/{train,valid}/ (parquet + schema.pbtxt) and the fitted workflow in
OUT_DIR/clicks/workflow/; session events -> OUT_DIR/sessions/{train,valid,workflow}/. Each
workflow is fitted on the training rows only; validation rows go through it as they are,
so ids training never saw become the OOV id.

NVTabular 23.08's ids for a categorical column: 0 padding (never written by Categorify; list
columns are padded with it), 1 null, 2 out-of-vocabulary (with ``num_buckets=k``: 2..k+1,
a hash of the value), then the vocabulary, most frequent first. The hashed column uses
``ValueCategorify`` (merlin_models_de.serving.hashing): NVTabular's own ``num_buckets`` hashes
with the row's index on CPU, so a value would land in a different bucket in every row. The table a column needs
has ``int_domain.max + 1`` rows, which is what the block reads from the schema.
"""

import argparse
import os

import nvtabular as nvt
from merlin.io import Dataset
from merlin.schema import Tags
from nvtabular import ops

from merlin_models_de.serving.hashing import ValueCategorify

MAX_SESSION_LENGTH = 20


def click_workflow(categories: str = "categories") -> nvt.Workflow:
    """Every kind of categorical encoding the ranking model takes: a frequency threshold
    (rare users share the OOV id), a vocabulary capped by ``max_size`` (items), hashed OOV
    buckets for a long tail (categories; ``ValueCategorify``: the bucket is a hash of the
    value alone), a plain vocabulary (device) and a list column
    (tags, multi-hot; the block pools it). Continuous columns get their nulls filled, the
    long-tailed price its log, and both are normalized (float64, as NVTabular writes them:
    Merlin's loader and the serving ensemble cast them to the model's float32). The label
    is tagged as the binary target. ``categories``: where Categorify writes its
    vocabularies while fitting (NVTabular's default is ./categories)."""
    user = ["user_id"] >> ops.Categorify(out_path=categories, freq_threshold=2) >> ops.TagAsUserID()
    item = ["item_id"] >> ops.Categorify(out_path=categories, max_size=400) >> ops.TagAsItemID()
    category = ["category"] >> ValueCategorify(out_path=categories, max_size=120, num_buckets=16)
    device = ["device"] >> ops.Categorify(out_path=categories)
    tags = ["tags"] >> ops.Categorify(out_path=categories)
    price = ["price"] >> ops.FillMissing() >> ops.LogOp() >> ops.Normalize()
    age = ["age"] >> ops.FillMissing() >> ops.Normalize()
    label = ["click"] >> ops.AddMetadata(tags=[Tags.BINARY_CLASSIFICATION, Tags.TARGET])
    return nvt.Workflow(user + item + category + device + tags + price + age + label)


def session_workflow(
    max_length: int = MAX_SESSION_LENGTH, categories: str = "categories"
) -> nvt.Workflow:
    """Events -> one row per session, as NVTabular's Groupby writes it: ``session_id``,
    the number of events ``item_id_count``, and the item ids (rare ones share the OOV id)
    and their categories as lists in time order (``item_id_list``, ``category_list``), cut
    to the last ``max_length`` events. The item list and the count inherit the ITEM and ID
    tags of ``item_id``; the list is the one list column with them, which is how the
    next-item command and examples/train_next_item.py find it. ``categories``: where
    Categorify writes its vocabularies while fitting."""
    items = (
        ["item_id"] >> ops.Categorify(out_path=categories, freq_threshold=2) >> ops.TagAsItemID()
    )
    category = ["category"] >> ops.Categorify(out_path=categories)
    grouped = (["session_id", "timestamp"] + items + category) >> ops.Groupby(
        groupby_cols=["session_id"],
        sort_cols=["timestamp"],
        aggs={"item_id": ["list", "count"], "category": ["list"]},
    )
    lists = (
        grouped["item_id_list", "category_list"]
        >> ops.ListSlice(-max_length)
        >> ops.AddMetadata(tags=[Tags.SEQUENCE])
    )
    return nvt.Workflow(grouped["session_id", "item_id_count"] + lists)


def run(workflow: nvt.Workflow, raw_dir: str, out_dir: str, partitions: int = 2) -> None:
    """Fits ``workflow`` on RAW_DIR/train.parquet, writes train and valid with
    ``partitions`` parquet files each (at least the number of ranks that will train), and
    saves the fitted workflow (Merlin Systems serves it in front of the model)."""
    train = Dataset(os.path.join(raw_dir, "train.parquet"), engine="parquet")
    valid = Dataset(os.path.join(raw_dir, "valid.parquet"), engine="parquet")
    workflow.fit(train)
    for name, data in (("train", train), ("valid", valid)):
        # the loader deals whole partitions to the ranks: at least one per rank
        workflow.transform(data).repartition(npartitions=partitions).to_parquet(
            os.path.join(out_dir, name), output_files=partitions
        )
    workflow.save(os.path.join(out_dir, "workflow"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("raw_dir")
    parser.add_argument("out_dir")
    parser.add_argument(
        "--partitions",
        type=int,
        default=2,
        help="parquet files per split (a multiple of the ranks that train)",
    )
    args = parser.parse_args(argv)
    clicks_out, sessions_out = (os.path.join(args.out_dir, n) for n in ("clicks", "sessions"))
    run(
        click_workflow(os.path.join(clicks_out, "categories")),
        os.path.join(args.raw_dir, "clicks"),
        clicks_out,
        args.partitions,
    )
    run(
        session_workflow(categories=os.path.join(sessions_out, "categories")),
        os.path.join(args.raw_dir, "events"),
        sessions_out,
        args.partitions,
    )
    print(f"NVTabular output (parquet + schema) and workflows in {args.out_dir}")


if __name__ == "__main__":
    main()
