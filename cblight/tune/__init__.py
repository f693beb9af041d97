"""Coherence tuning (paper appendix "From coherence boosting to coherence tuning")."""
