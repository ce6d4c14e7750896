"""Sentence segmentation behind one function.

blingfire (Microsoft's finite-state segmenter, model compiled into its wheel, no downloads) was
picked over pysbd and syntok: see docs/benchmarks.md section 2 for the comparison on real text.
"""

from __future__ import annotations

import blingfire


def split_sentences(text: str) -> list[str]:
    """Split one paragraph into sentences (whitespace-stripped, empty ones dropped)."""
    if not text.strip():
        return []
    return [s.strip() for s in blingfire.text_to_sentences(text).split("\n") if s.strip()]
