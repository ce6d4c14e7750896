"""The pretraining example format on disk: Parquet shards, one row per example.

Both the preprocessing job (writer) and the pretraining loader (reader) import this module, so
the format is defined once. Sequences are stored unpadded; the loader pads each batch to its
longest sequence. Bump SCHEMA_VERSION on any change; readers refuse other versions.
"""

from __future__ import annotations

import pyarrow as pa

SCHEMA_VERSION = 1

# next_sentence_label: 0 = IsNext (B follows A in the source), 1 = NotNext (B from another
# document), the convention of the original BERT data and of transformers' BertForPreTraining.
IS_NEXT = 0
NOT_NEXT = 1

SCHEMA = pa.schema(
    [
        pa.field("input_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("segment_ids", pa.list_(pa.int8()), nullable=False),
        pa.field("masked_lm_positions", pa.list_(pa.int32()), nullable=False),
        pa.field("masked_lm_ids", pa.list_(pa.int32()), nullable=False),
        pa.field("next_sentence_label", pa.int8(), nullable=False),
    ],
    metadata={"bertflow_schema_version": str(SCHEMA_VERSION)},
)

SHARD_PATTERN = "shard-{index:05d}-of-{count:05d}.parquet"
MANIFEST_NAME = "manifest.json"
STATS_NAME = "stats.json"
