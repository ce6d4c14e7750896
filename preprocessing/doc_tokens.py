"""Documents → sentences → token ids, and a compact bytes form for shipping them between workers."""

from __future__ import annotations

from collections import Counter

import numpy as np
from tokenizers import Tokenizer

from preprocessing.corpus import Document
from preprocessing.sentences import split_sentences

Packed = tuple[bytes, bytes, str]  # (token ids, sentence lengths as int32, dtype of the ids)


def tokenize_documents(tok: Tokenizer, docs: list[Document], counts: Counter) -> list[list[list[int]]]:
    """Each document as a list of sentences (token id lists, no special tokens, none empty)."""
    flat: list[str] = []
    bounds: list[int] = [0]
    for doc in docs:
        for para in doc.paragraphs:
            flat.extend(split_sentences(para))
        bounds.append(len(flat))
    unk = tok.token_to_id("[UNK]")
    encodings = tok.encode_batch_fast(flat, add_special_tokens=False) if flat else []
    out: list[list[np.ndarray]] = []
    for d in range(len(docs)):
        sentences = [e.ids for e in encodings[bounds[d] : bounds[d + 1]]]
        sentences = [s for s in sentences if len(s)]
        counts["sentences"] += len(sentences)
        counts["tokens"] += sum(len(s) for s in sentences)
        counts["tokens_unk"] += sum(s.count(unk) for s in sentences) if unk is not None else 0
        out.append(sentences)
    return out


def pack(sentences: list[list[int]], vocab_size: int) -> Packed:
    dtype = "uint16" if vocab_size <= 65535 else "int32"
    ids = np.fromiter((t for s in sentences for t in s), dtype=dtype)
    lens = np.asarray([len(s) for s in sentences], dtype=np.int32)
    return ids.tobytes(), lens.tobytes(), dtype


def unpack(packed: Packed) -> list[list[int]]:
    ids_b, lens_b, dtype = packed
    ids = np.frombuffer(ids_b, dtype=dtype).tolist()
    ends = np.cumsum(np.frombuffer(lens_b, dtype=np.int32)).tolist()
    return [ids[a:b] for a, b in zip([0, *ends[:-1]], ends)]
