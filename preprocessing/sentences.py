"""Sentence segmentation behind one function.

blingfire (Microsoft's finite-state segmenter, model compiled into its wheel, no downloads) was
picked over pysbd and syntok: see docs/benchmarks.md section 2 for the comparison on real text.

Its C function is called here with an output buffer kept per thread: `blingfire.text_to_sentences`
allocates and zero-fills a new one of twice the input's size for every call, which cost as much as
the segmentation itself on Wikipedia's paragraphs. Same function, same arguments, same result
(`tests/test_corpus.py` compares the two).
"""

from __future__ import annotations

import ctypes
import threading

import blingfire

_text_to_sentences = blingfire.blingfire.TextToSentences  # the wheel's C library (ctypes)
_buffers = threading.local()


def _segment(text: str) -> str:
    """`blingfire.text_to_sentences(text)`: sentences separated by newlines ('' on failure)."""
    data = text.encode("utf-8")
    size = 2 * len(data)  # the output room blingfire's wrapper gives
    buffer = getattr(_buffers, "buffer", None)
    if buffer is None or len(buffer) < size:
        buffer = _buffers.buffer = ctypes.create_string_buffer(max(size, 1 << 16))
    written = _text_to_sentences(ctypes.c_char_p(data), ctypes.c_int(len(data)), buffer, ctypes.c_int(size))
    if written == -1 or written > size:
        return ""
    # the wrapper's fresh buffer is zero after the output; here only the first `written` bytes are this call's
    return ctypes.string_at(buffer, written).split(b"\0", 1)[0].decode("utf-8")


def split_sentences(text: str) -> list[str]:
    """Split one paragraph into sentences (whitespace-stripped, empty ones dropped)."""
    if not text.strip():
        return []
    return [s.strip() for s in _segment(text).split("\n") if s.strip()]
