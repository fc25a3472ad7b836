"""Host side of differentiation: activity annotations and modes (the tape arrives here too)."""
