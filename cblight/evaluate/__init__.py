"""Boosted evaluation: next-token and multiple-choice scoring (paper Tables 1, 4, 5, 11, 12)."""
