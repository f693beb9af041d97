"""The alpha-curve plots: which k lines a next-token plot draws, and its y-axis (no 20-line legend over the
title, no flat band around 0 when every accuracy is 0)."""

from __future__ import annotations

import pytest

from cblight.evaluate.task_scoring import _accuracy_limits, next_token_curves, save_alpha_plot

KS = list(range(1, 21))


def test_next_token_plot_draws_k_star_the_best_k_and_the_ends():
    accuracy = [[0.1 * k + 0.01 * j for j in range(3)] for k in KS]  # every curve distinct
    curves, highlight = next_token_curves(KS, accuracy, k_star=7, oracle_k=13)
    labels = list(curves)
    assert len(labels) <= 5
    assert {"k = 7 (k*)", "k = 13", "k = 1", "k = 20"} <= set(labels)
    assert highlight == "k = 7 (k*)"
    assert curves["k = 13"] == accuracy[12]


def test_identical_curves_share_one_line():
    curves, highlight = next_token_curves(KS, [[0.0, 0.0] for _ in KS], k_star=1, oracle_k=1)
    assert list(curves) == [highlight]
    assert highlight.startswith("k = 1, ") and highlight.endswith("20 (k*)")


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([0.0, 0.0], (-0.06, 2.0)),  # all zero: a 0-2 % axis, the line visible just above the bottom
        ([30.0, 32.0], (29.0, 33.0)),  # a 1-point margin each side
        ([0.0, 100.0], (-3.0, 100.0)),  # never above 100
    ],
)
def test_accuracy_axis_limits(values, expected):
    assert _accuracy_limits(values) == pytest.approx(expected)


def test_plot_is_written(tmp_path):
    path = save_alpha_plot(
        tmp_path / "p.png", "t", [0.0, -0.5, -1.0], {"k = 1": [0.0, 0.0, 0.0]}, chosen_alpha=0.0
    )
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
