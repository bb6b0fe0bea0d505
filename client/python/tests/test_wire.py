"""The Python wire types against the Rust ones and against docs/protocol.md.

- Every sample the Rust test ``tests/tests/wire_samples.rs`` serialised from the
  Rust types (``client/typescript/test/fixtures/wire-samples.json``) parses with
  the Python validator of its type, and the parsed samples, written back as
  ``serde_json::to_string_pretty`` writes them, give the file byte for byte.
- Every complete JSON example of ``docs/protocol.md`` parses as its type and is
  produced again byte for byte (compact, in the document's key order).
- The header name, the error codes and which statuses are retried match the
  Rust contract (the fixture's ``Contract``).
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Dict, List

import pytest

from permitd import wire
from permitd.plan import RETRYABLE_STATUSES

REPOSITORY = Path(__file__).resolve().parents[3]
FIXTURE = REPOSITORY / "client" / "typescript" / "test" / "fixtures" / "wire-samples.json"
PROTOCOL = REPOSITORY / "docs" / "protocol.md"


def samples() -> Dict[str, List[Any]]:
    value = json.loads(FIXTURE.read_text())
    assert isinstance(value, dict)
    return value


def test_the_rust_samples_parse_and_are_produced_byte_for_byte() -> None:
    text = FIXTURE.read_text()
    loaded = json.loads(text)
    produced: Dict[str, Any] = {}
    for name, values in loaded.items():
        if name == "Contract":
            produced[name] = values
            continue
        assert name in wire.PARSERS, f"no Python validator for the Rust wire type {name}"
        assert values, name
        produced[name] = [wire.parse(name, value) for value in values]
    assert wire.encode_pretty(produced) + "\n" == text


def test_every_python_validator_has_rust_samples() -> None:
    loaded = samples()
    for name in wire.PARSERS:
        assert loaded.get(name), f"no Rust samples for {name}"


def _protocol_examples() -> List[Any]:
    examples = []
    for block in re.findall(r"```json\n(.*?)```", PROTOCOL.read_text(), re.S):
        try:
            examples.append(json.loads(block))
        except ValueError:
            continue  # an elided example ("grants": […]), not a whole message
    return examples


def _shape_of(example: Dict[str, Any]) -> str:
    if example.get("type") in ("request", "sync"):
        return "SemaphoreRequest"
    if example.get("type") in ("grant", "synced"):
        return "SemaphoreResponse"
    if "roundWaitMs" in example:
        return "KeyConfig"
    if "error" in example:
        return "ErrorAnswer"
    if "existed" in example:
        return "KeyDeleted"
    return "TokenSpec"


def test_the_protocol_documents_examples_are_parsed_and_produced_byte_for_byte() -> None:
    shapes = []
    for example in _protocol_examples():
        shape = _shape_of(example)
        shapes.append(shape)
        if shape == "TokenSpec":
            continue  # tokens are admin JSON, passed through as given
        assert wire.encode(wire.parse(shape, example)) == wire.encode(example), shape
    assert sorted(shapes) == ["ErrorAnswer", "KeyConfig", "KeyDeleted", "SemaphoreRequest", "SemaphoreResponse", "TokenSpec"]


@pytest.mark.parametrize(
    ("name", "change", "path"),
    [
        ("SemaphoreRequest", {"v": 2}, "SemaphoreRequest.v"),
        ("SemaphoreRequest", {"type": "nope"}, "SemaphoreRequest.type"),
        ("SemaphoreRequest", {"demand": [{"group": "g", "count": -1, "oldestAt": 0}]}, "SemaphoreRequest.demand[0].count"),
        ("SemaphoreRequest", {"demand": [{"group": "g", "count": 1.5, "oldestAt": 0}]}, "SemaphoreRequest.demand[0].count"),
        ("SemaphoreRequest", {"demand": [{"group": "g", "count": True, "oldestAt": 0}]}, "SemaphoreRequest.demand[0].count"),
        ("Usage", {"available": "1"}, "Usage.available"),
        ("ErrorAnswer", {"error": {"code": 1, "message": "m"}}, "ErrorAnswer.error.code"),
    ],
)
def test_malformed_values_are_refused_with_the_path_of_the_bad_field(name: str, change: Dict[str, Any], path: str) -> None:
    value = {**copy.deepcopy(samples()[name][0]), **change}
    with pytest.raises(wire.WireError) as refused:
        wire.parse(name, value)
    assert refused.value.path == path


def test_the_header_name_error_codes_and_retried_statuses_match_the_rust_contract() -> None:
    contract = samples()["Contract"][0]
    assert contract["leaderHeader"] == wire.LEADER_HEADER
    assert list(wire.ERROR_CODES) == [entry["code"] for entry in contract["errorCodes"]]
    # The client retries exactly the answers a node marks retryable (429, 503), plus gateway failures.
    for entry in contract["errorCodes"]:
        assert (entry["status"] in RETRYABLE_STATUSES) == entry["retryAfter"], entry["code"]
