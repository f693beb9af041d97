"""The declared option types (cblight.option_types): each refuses what its words exclude, says its bound in
words, and survives pickling where its module binds it (a value in a checkpoint's hyperparameters)."""

from __future__ import annotations

import math
import pickle
import re

import pytest

from cblight import option_types
from cblight.errors import ConfigError
from cblight.option_types import check_fields, describe
from cblight.tune.validation import AtLeastTwo

# (type, a value it takes, a value it refuses)
CASES = [
    (option_types.PositiveInt, 1, 0),
    (option_types.NonNegativeInt, 0, -1),
    (option_types.PositiveFloat, 1e-9, 0.0),
    (option_types.NonNegativeFloat, 0.0, -1e-9),
    (option_types.ClosedUnitInterval, 1.0, 1.5),
    (option_types.OpenUnitInterval, 0.5, 1.0),
    (option_types.FiniteFloat, -3.0, math.inf),
    (option_types.PositiveFiniteFloat, 2.0, math.nan),
    (option_types.PositiveUnitInterval, 1.0, 0.0),
    (option_types.RatioAtLeastOne, 1.0, 0.99),
    (option_types.NotEmptyStr, "x", ""),
    (AtLeastTwo, 2, 1),
]


@pytest.mark.parametrize(("hint", "good", "bad"), CASES, ids=[c[0].__name__ for c in CASES])
def test_a_declared_type_takes_its_values_refuses_the_rest_and_pickles(hint, good, bad):
    value = hint(good)
    assert value == good and isinstance(value, hint.base)
    assert pickle.loads(pickle.dumps(value)) == value  # found again under its module's name
    with pytest.raises(ValueError, match=re.escape(hint.words)):
        hint(bad)
    assert describe(hint) == hint.words


def test_an_int_type_takes_no_fraction_and_no_bool():
    for bad in (1.5, True):
        with pytest.raises(ValueError):
            option_types.PositiveInt(bad)


def test_check_fields_names_the_field_its_words_and_the_value():
    import dataclasses

    @dataclasses.dataclass(frozen=True)
    class Options:
        steps: option_types.PositiveInt = 1

        def __post_init__(self):
            check_fields(self)

    with pytest.raises(ConfigError, match=r"steps.*an integer >= 1.*0"):
        Options(steps=0)
