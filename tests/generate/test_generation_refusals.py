"""``cblight generate`` as a user types it: a run with no row at all is refused before the model loads, and a
row that cannot decode its prompts is named in the one-line error."""

import json

import pytest

from tests.helpers import (
    generate_args,
)


class Loaded(AssertionError):
    pass


def test_no_decodings_and_no_grid_is_refused_before_the_model_loads(
    cli, tiny_gpt2_dir, tmp_path, capsys, monkeypatch
):
    import cblight.evaluator as base
    import cblight.generate.generation_evaluator as generation
    import cblight.models as models

    def load(*args, **kwargs):
        raise Loaded("a model or tokenizer was loaded before the bad input was refused")

    for module in (models, generation):
        monkeypatch.setattr(module, "load_causal_lm", load)
    monkeypatch.setattr(base, "build_causal_lm", load)
    for module in (models, base):
        monkeypatch.setattr(module, "load_tokenizer", load)
    argv = generate_args(tiny_gpt2_dir, tmp_path / "out", "--model.grid", "null", "--model.decodings", "[]")
    status, err, _ = cli(argv)
    assert status == 2, err
    assert err == [
        "error: model.decodings is empty and model.grid is null: no row to generate; name a decoding "
        "(e.g. --model.decodings '[{name: greedy}]') or a grid"
    ]
    assert not (tmp_path / "out" / "generations").exists()


def test_a_row_that_cannot_decode_is_named(cli, tiny_gpt2_dir, tmp_path, capsys):
    """A marker-mode row on WebText, whose prompts hold no `` TL;DR:``: the error names the row."""
    rows = json.dumps([{"name": "tldr", "boosting": {"mode": "marker", "alpha": -0.5}}])
    argv = generate_args(tiny_gpt2_dir, tmp_path / "out", "--model.grid", "null", "--model.decodings", rows)
    status, err, _ = cli(argv)
    assert status == 2, err
    errors = [line for line in err if line.startswith("error:")]
    assert errors == err[-1:], "\n".join(err)  # after the run's progress, one line
    assert errors[0].startswith("error: decoding 'tldr': prompt 0 does not contain the marker ' TL;DR:'"), (
        errors
    )


@pytest.mark.parametrize("decodings", ["[]", None])
def test_resolve_decodings_from_python(decodings):
    from cblight.errors import ConfigError
    from cblight.generate.rows import DecodingGrid, resolve_decodings

    rows, _ = resolve_decodings(None if decodings is None else [], DecodingGrid(alphas=(-0.5,), ks=(4,)))
    assert [r.name for r in rows] == (["greedy"] if decodings is None else []) + ["boost k=4 alpha=-0.5"]
    if decodings is not None:
        with pytest.raises(ConfigError, match=r"model\.decodings is empty and model\.grid is null"):
            resolve_decodings([], None)
