"""Small helpers shared by every stage: user-facing errors, data paths, atomic file writes."""
