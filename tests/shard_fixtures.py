"""Real-text pretraining shards for the pretrain tests, until the Beam preprocess stage lands.

Documents from wiki/summaries_en.txt, tokenized with the real bert-base-uncased WordPiece vocab
(all-MiniLM-L6-v2's tokenizer.json), `[CLS] A [SEP] B [SEP]` pairs (B the true continuation or a
sentence run from another document, 50/50), 15% masking (80/10/10), written with
`preprocessing.shard_format` in its directory layout. The lead replaces this with the real stage.
"""

from __future__ import annotations

import random
import re
import shutil
from pathlib import Path

from common.atomic import atomic_write_json, sha256_file, write_marker
from preprocessing import shard_format


def make_tokenizer_dir(minilm_dir: Path, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.txt", "tokenizer.json"):
        shutil.copyfile(minilm_dir / name, out / name)
    return out


def _documents(data_dir: Path, num_docs: int) -> list[list[str]]:
    docs = []
    for line in (data_dir / "wiki" / "summaries_en.txt").open(encoding="utf-8"):
        sents = [s for s in re.split(r"(?<=[.!?])\s+", line.strip()) if s]
        if len(sents) >= 2:
            docs.append(sents)
        if len(docs) >= num_docs:
            break
    return docs


def make_shards(
    out: Path,
    tokenizer_dir: Path,
    data_dir: Path,
    num_docs: int = 600,
    max_seq_length: int = 128,
    num_train_shards: int = 2,
    seed: int = 1,
) -> Path:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    vocab = tok.get_vocab()
    cls_id, sep_id, mask_id = vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"]
    rng = random.Random(seed)
    docs = _documents(data_dir, num_docs)
    encoded = [
        [e.ids for e in tok.encode_batch(d, add_special_tokens=False)] for d in docs
    ]  # doc -> sentence -> ids
    budget = max_seq_length - 3
    rows = []
    for di, sents in enumerate(encoded):
        cut = max(1, len(sents) // 2)
        a = [t for s in sents[:cut] for t in s]
        if rng.random() < 0.5 or cut >= len(sents):
            other = encoded[(di + rng.randrange(1, len(encoded))) % len(encoded)]
            b, label = [t for s in other for t in s], shard_format.NOT_NEXT
        else:
            b, label = [t for s in sents[cut:] for t in s], shard_format.IS_NEXT
        while len(a) + len(b) > budget:
            (a if len(a) > len(b) else b).pop()
        if not a or not b:
            continue
        ids = [cls_id, *a, sep_id, *b, sep_id]
        seg = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        cand = [i for i, t in enumerate(ids) if t not in (cls_id, sep_id)]
        k = min(20, max(1, round(0.15 * len(cand))))
        pos = sorted(rng.sample(cand, k))
        labels = [ids[p] for p in pos]
        for p in pos:
            r = rng.random()
            if r < 0.8:
                ids[p] = mask_id
            elif r < 0.9:
                ids[p] = rng.randrange(len(vocab))
        rows.append(
            {
                "input_ids": ids,
                "segment_ids": seg,
                "masked_lm_positions": pos,
                "masked_lm_ids": labels,
                "next_sentence_label": label,
            }
        )
    n_val = max(16, len(rows) // 10)
    splits = {"validation": [rows[:n_val]], "train": []}
    train = rows[n_val:]
    per = -(-len(train) // num_train_shards)
    splits["train"] = [train[i * per : (i + 1) * per] for i in range(num_train_shards)]
    manifest = {
        "schema_version": shard_format.SCHEMA_VERSION,
        "config": {"max_seq_length": max_seq_length, "masked_lm_prob": 0.15, "max_predictions_per_seq": 20},
        "tokenizer_sha256": sha256_file(tokenizer_dir / "vocab.txt"),
        "input_fingerprint": "tests/shard_fixtures.py",
        "splits": {},
    }
    for split, parts in splits.items():
        manifest["splits"][split] = [
            shard_format.write_shard(
                out / split / shard_format.shard_name(i, len(parts)), shard_format.rows_to_table(part)
            )
            for i, part in enumerate(parts)
        ]
    atomic_write_json(out / shard_format.STATS_NAME, {"examples": len(rows)})
    atomic_write_json(out / shard_format.MANIFEST_NAME, manifest)
    write_marker(out, {"examples": len(rows)})
    return out
