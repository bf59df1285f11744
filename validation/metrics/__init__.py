"""Pure metrics of an aligned pair (pixels, body skin, floor measures): no thresholds, no verdicts."""
