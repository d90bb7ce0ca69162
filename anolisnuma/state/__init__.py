"""State: records of pods and containers, allocations, atomic persistence."""
