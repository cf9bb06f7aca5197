"""Raw rows as a user has them before NVTabular: a click log and session events.

String ids, nulls, skewed (Zipf-like) frequencies, and validation rows with ids the training
rows never had. Deterministic for a seed.

    python examples/raw_data.py OUT_DIR [--rows 4000] [--sessions 600]

writes OUT_DIR/clicks/{train,valid}.parquet and OUT_DIR/events/{train,valid}.parquet.
"""

import argparse
import os

import numpy as np
import pandas as pd


def _zipf_ids(rng, prefix, count, catalog, unseen_from=None):
    """``count`` string ids drawn with Zipf-like popularity from ``catalog`` ids;
    ``unseen_from`` shifts them past the training catalog (ids training never saw)."""
    ranks = np.minimum(rng.zipf(1.3, count), catalog) - 1
    if unseen_from is not None:
        ranks = ranks + unseen_from
    return np.array([f"{prefix}{r}" for r in ranks], dtype=object)


def _with_nulls(rng, values, rate):
    values = values.copy()
    values[rng.random(len(values)) < rate] = None
    return values


def click_log(rows: int, seed: int, unseen: float = 0.0) -> pd.DataFrame:
    """One impression per row: user, item, its category (high cardinality, hashed later),
    device, the item's tags (a list), price, age and whether it was clicked. ``unseen``: the
    share of users and items drawn past the training catalog."""
    rng = np.random.default_rng(seed)
    fresh = rng.random(rows) < unseen
    users = _zipf_ids(rng, "u", rows, 2000)
    users[fresh] = _zipf_ids(rng, "u", int(fresh.sum()), 100, unseen_from=5000)
    items = _zipf_ids(rng, "i", rows, 1500)
    items[fresh] = _zipf_ids(rng, "i", int(fresh.sum()), 100, unseen_from=5000)
    categories = np.array([f"c{int(i[1:]) * 7 % 997}" for i in items], dtype=object)
    tag_count = rng.integers(0, 4, rows)  # some rows have no tags at all
    tags = [[f"t{t}" for t in rng.zipf(1.5, n) % 50] for n in tag_count]
    price = rng.gamma(2.0, 10.0, rows)
    price[rng.random(rows) < 0.05] = np.nan
    age = rng.normal(35, 10, rows)
    age[rng.random(rows) < 0.1] = np.nan
    # clicks depend on the device and a few items, so a model has something to learn
    device = rng.choice(
        np.array(["mobile", "desktop", "tablet"], dtype=object), rows, p=[0.6, 0.3, 0.1]
    )
    logit = -1.0 + 0.8 * (device == "mobile") + 0.6 * np.isin(items, ["i0", "i1", "i2"])
    click = (rng.random(rows) < 1 / (1 + np.exp(-logit))).astype(np.int64)
    return pd.DataFrame(
        {
            "user_id": _with_nulls(rng, users, 0.03),
            "item_id": items,
            "category": categories,
            "device": _with_nulls(rng, device, 0.05),
            "tags": tags,
            "price": price,
            "age": age,
            "click": click,
        }
    )


def session_events(
    sessions: int, seed: int, unseen: float = 0.0, first_session: int = 0
) -> pd.DataFrame:
    """One event per row: session id, timestamp, item id (string, Zipf-like, a few nulls)
    and the item's category; sessions of 2..12 events, rows in no particular order."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(2, 13, sessions)
    count = int(lengths.sum())
    items = _zipf_ids(rng, "p", count, 3000)
    fresh = rng.random(count) < unseen
    items[fresh] = _zipf_ids(rng, "p", int(fresh.sum()), 50, unseen_from=9000)
    frame = pd.DataFrame(
        {
            "session_id": np.repeat(np.arange(first_session, first_session + sessions), lengths),
            "timestamp": rng.integers(0, 10**6, count),
            "item_id": _with_nulls(rng, items, 0.02),
        }
    )
    frame["category"] = [None if i is None else f"k{int(i[1:]) % 40}" for i in frame["item_id"]]
    return frame.sample(frac=1.0, random_state=seed).reset_index(drop=True)


def write(out_dir: str, rows: int = 4000, sessions: int = 600, seed: int = 0) -> None:
    for name, train, valid in (
        ("clicks", click_log(rows, seed), click_log(rows // 4, seed + 1, unseen=0.1)),
        (
            "events",
            session_events(sessions, seed),
            session_events(sessions // 4, seed + 1, unseen=0.1, first_session=10**6),
        ),
    ):
        os.makedirs(os.path.join(out_dir, name), exist_ok=True)
        train.to_parquet(os.path.join(out_dir, name, "train.parquet"))
        valid.to_parquet(os.path.join(out_dir, name, "valid.parquet"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--sessions", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    write(args.out_dir, args.rows, args.sessions, args.seed)
    print(f"raw click log and session events in {args.out_dir}")


if __name__ == "__main__":
    main()
