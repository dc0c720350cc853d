"""fast_json: orjson on the hot path, the json module for what orjson refuses, and the same values either way."""

import json
import math

import pytest

from uni_agent.fast_json import dumps_json, loads_json


def test_round_trip_matches_the_json_module() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "héllo \u2603 \"quoted\"\n"}], "n": 3, "t": 0.7,
            "tools": None, "flags": [True, False]}
    assert json.loads(dumps_json(body)) == body
    assert loads_json(json.dumps(body)) == body


def test_what_orjson_refuses_goes_through_the_json_module() -> None:
    huge = {"seed": 2**70, 3: "int key"}  # over 64 bits, and a non-string key: orjson raises on both
    assert json.loads(dumps_json(huge)) == {"seed": 2**70, "3": "int key"}
    answer = loads_json(b'{"logprob": -Infinity, "x": NaN}')  # some servers write these; json accepts them
    assert answer["logprob"] == -math.inf and math.isnan(answer["x"])


def test_malformed_input_is_still_a_value_error() -> None:
    with pytest.raises(ValueError):
        loads_json(b'{"choices": [')
