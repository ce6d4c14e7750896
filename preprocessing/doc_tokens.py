"""Documents → sentences → token ids (`sentence_encoder`), and a compact bytes form for the work files."""

from __future__ import annotations

from collections import Counter

import numpy as np

from preprocessing.corpus import Document
from preprocessing.sentence_encoder import SentenceEncoder
from preprocessing.sentences import split_sentences

Packed = tuple[bytes, bytes, str]  # (token ids, sentence lengths as int32, dtype of the ids)
DocIds = tuple[np.ndarray, np.ndarray]  # (the document's token ids, each sentence's count of them)


def tokenize_documents(encoder: SentenceEncoder, docs: list[Document], counts: Counter) -> list[DocIds]:
    """Each document's sentences as token ids (no special tokens, no empty sentence)."""
    flat: list[str] = []
    bounds: list[int] = [0]
    for doc in docs:
        for para in doc.paragraphs:
            flat.extend(split_sentences(para))
        bounds.append(len(flat))
    ids, lengths = encoder.encode(flat) if flat else (np.zeros(0, np.int64), np.zeros(0, np.int64))
    unk = encoder.tok.token_to_id("[UNK]")
    counts["sentences"] += int(np.count_nonzero(lengths))
    counts["tokens"] += len(ids)
    counts["tokens_unk"] += int(np.count_nonzero(ids == unk)) if unk is not None else 0
    id_bounds = np.concatenate(([0], np.cumsum(lengths)))
    out: list[DocIds] = []
    for d in range(len(docs)):
        lo, hi = bounds[d], bounds[d + 1]
        doc_lengths = lengths[lo:hi]
        out.append((ids[id_bounds[lo] : id_bounds[hi]], doc_lengths[doc_lengths > 0]))
    return out


def pack(doc: DocIds, vocab_size: int) -> Packed:
    ids, lengths = doc
    dtype = "uint16" if vocab_size <= 65535 else "int32"
    return ids.astype(dtype).tobytes(), lengths.astype(np.int32).tobytes(), dtype


def unpack(packed: Packed) -> list[list[int]]:
    ids_b, lens_b, dtype = packed
    ids = np.frombuffer(ids_b, dtype=dtype).tolist()
    ends = np.cumsum(np.frombuffer(lens_b, dtype=np.int32)).tolist()
    return [ids[a:b] for a, b in zip([0, *ends[:-1]], ends)]
