"""The one NDJSON writer of the streams (``api.streams.ndjson``): a line per result, and NaN as each reader needs."""

from __future__ import annotations

import json
import math

from hpc_master.api.streams import ndjson


def test_one_result_per_line() -> None:
    body = ndjson([{"a": 1}, {"b": "é"}])
    lines = body.decode().splitlines()
    assert [json.loads(line) for line in lines] == [{"result": {"a": 1}}, {"result": {"b": "é"}}]
    assert body.endswith(b"\n") and ndjson([]) == b""


def test_a_nan_is_null_for_a_browser_and_nan_for_python() -> None:
    browser = json.loads(ndjson([{"loss": math.nan, "inf": math.inf}], browser=True))
    assert browser == {"result": {"loss": None, "inf": None}}  # JSON.parse refuses NaN
    python = json.loads(ndjson([{"loss": math.nan}]))  # Determined's client reads NaN back
    assert math.isnan(python["result"]["loss"])
