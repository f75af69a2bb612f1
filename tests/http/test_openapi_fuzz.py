"""Schemathesis against a real `fencepost serve`: every operation of /openapi.json, with
an admin, a member and a reader key, valid and invalid input. Every answer must be
documented: no 5xx, a status the operation lists, the content type, body schema and
response headers the document gives; invalid input is refused with a 4xx, and input
the document calls valid is not refused as bad input.

Bounded and repeatable: a few hundred derandomized Hypothesis cases plus
Schemathesis' deterministic coverage cases (each bound just inside and outside, about
a thousand small requests), every request with a timeout; ~20 s on 2 cores."""

from __future__ import annotations

from typing import Any, Iterator

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    missing_required_header,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.specs.openapi.schemas import OpenApiSchema

from fencepost.server.routes.table import ROUTES
from support import ServerProcess

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, response_headers_conformance]
NEGATIVE_CHECKS = [*CHECKS, negative_data_rejection, missing_required_header]
# Cases per operation: the admin passes every role check, so it reaches the most code.
EXAMPLES = {"admin": 6, "member": 3, "reader": 2}
NEGATIVE_EXAMPLES = 3
REQUEST_TIMEOUT_S = 10  # a request that takes longer is a hang (waits are capped below)
MAX_WAIT_MS = 200
OPERATION_IDS = [route.operation_id for route in ROUTES]
# Operations with something to make invalid (a parameter or a body).
NEGATABLE = [route.operation_id for route in ROUTES
             if route.body is not None or route.params or route.path_params]
POOL = "fuzz-pool"
# Fields whose rules JSON Schema cannot state: renew_interval_ms < term_ms, min_limit <=
# limit, allow_ips must be CIDRs, metadata at most 4 KiB as JSON.
RULES_BEYOND_SCHEMA = {"renew_interval_ms", "min_limit", "allow_ips", "metadata", "on_expiry",
                       "upstream.base_url", "upstream.headers"}


class Fuzz:
    def __init__(self, server: ServerProcess, schema: OpenApiSchema) -> None:
        self.server = server
        self.schema = schema
        self.keys = {
            "admin": server.admin_key,
            "member": server.create_key("member", name="fuzz-member")["key"],
            "reader": server.create_key("reader", name="fuzz-reader")["key"],
        }
        # By operation ID, every status that valid input got: a negative run's
        # 2xx (a bad body accepted) must not pass for the success path.
        self.statuses: dict[str, set[int]] = {}

    def run(self, operation_id: str, role: str, mode: GenerationMode, examples: int,
            checks: list[Any], path_parameters: dict[str, str] | None = None) -> None:
        operation = self.schema.find_operation_by_id(operation_id)
        strategy = operation.as_strategy(generation_mode=mode, path_parameters=path_parameters)
        auth = {"Authorization": f"Bearer {self.keys[role]}"}

        @settings(max_examples=examples, derandomize=True, database=None, deadline=None,
                  suppress_health_check=list(HealthCheck), print_blob=False)
        @given(case=strategy)
        def check(case: Any) -> None:
            _cap_waits(case)
            response = case.call(base_url=self.server.base_url, headers=auth,
                                 timeout=REQUEST_TIMEOUT_S)
            self._record(operation_id, case, response, mode)
            case.validate_response(response, checks=checks, headers=auth)

        check()

    def run_coverage(self, operation_id: str) -> None:
        operation = self.schema.find_operation_by_id(operation_id)
        cases = self.schema.iter_coverage_cases(
            operation, generation_modes=list(GenerationMode),
            generation_config=self.schema.config.generation_for(operation=operation),
        )
        auth = {"Authorization": f"Bearer {self.keys['admin']}"}
        for case in cases:
            _cap_waits(case)
            response = case.call(base_url=self.server.base_url, headers=auth,
                                 timeout=REQUEST_TIMEOUT_S)
            mode = None if case.meta is None else case.meta.generation.mode
            self._record(operation_id, case, response, mode)
            case.validate_response(response, checks=NEGATIVE_CHECKS, headers=auth)

    def _record(self, operation_id: str, case: Any, response: Any,
                mode: GenerationMode | None) -> None:
        """Note the status; input the document calls valid must not be refused as bad
        input, except by the rules JSON Schema cannot state (each in the document's
        field descriptions)."""
        if mode is None or not mode.is_positive:
            return
        self.statuses.setdefault(operation_id, set()).add(response.status_code)
        if response.status_code in (400, 422):
            error = response.json()["error"]
            fields = {d["field"] for d in error.get("details") or [{"field": "?"}]}
            assert fields <= RULES_BEYOND_SCHEMA, (
                f"{operation_id}: valid input refused: {response.status_code} {error}\n"
                f"{case.as_curl_command()}")


def _cap_waits(case: Any) -> None:
    """A long wait in line is the service working, not a hang: shorten each wait the
    server would honour (it refuses out-of-range ones at once) so the run stays
    bounded, since an acquire may find a lock or pool that an earlier case filled."""
    body = case.body
    if isinstance(body, dict):
        for name, cap, most in (("wait_seconds", MAX_WAIT_MS / 1000, 300), ("wait_ms", MAX_WAIT_MS,
                                                                          None)):
            if name in body:
                body[name] = _capped(body[name], cap, most)
    headers = case.headers or {}
    for name in list(headers):
        value = str(headers[name]).strip()
        if name.lower() == "x-queue-timeout-ms" and value.isascii() and value.isdigit():
            headers[name] = str(_capped(int(value), MAX_WAIT_MS, None))


def _capped(value: Any, cap: float, most: float | None) -> Any:
    """`cap` for a number the server would wait for longer, else `value` as it was."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return cap if cap < value and (most is None or value <= most) else value


@pytest.fixture(scope="module")
def fuzz(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzz]:
    """A server of its own: the fuzzer creates keys, pools and locks at will."""
    server = ServerProcess(tmp_path_factory.mktemp("fuzz")).start()
    try:
        document = httpx.get(f"{server.base_url}/openapi.json", timeout=30).json()
        yield Fuzz(server, schemathesis.openapi.from_dict(document))
    finally:
        server.stop()


@pytest.mark.parametrize("role", sorted(EXAMPLES))
@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_valid_input_gets_documented_answers(fuzz: Fuzz, operation_id: str, role: str) -> None:
    fuzz.run(operation_id, role, GenerationMode.POSITIVE, EXAMPLES[role], CHECKS)


@pytest.mark.parametrize("role", ["admin", "member"])
@pytest.mark.parametrize("operation_id", NEGATABLE)
def test_invalid_input_is_refused_with_a_documented_4xx(fuzz: Fuzz, operation_id: str,
                                                        role: str) -> None:
    fuzz.run(operation_id, role, GenerationMode.NEGATIVE, NEGATIVE_EXAMPLES, NEGATIVE_CHECKS)


@pytest.mark.parametrize("operation_id", OPERATION_IDS)
def test_boundary_values_get_documented_answers(fuzz: Fuzz, operation_id: str) -> None:
    """Schemathesis' coverage cases: each bound of each parameter and field, just
    inside and just outside, missing required parts, wrong types; deterministic."""
    fuzz.run_coverage(operation_id)


@pytest.fixture
def live_slot(fuzz: Fuzz) -> str:
    """A pool that exists and a slot held in it, so the slot routes answer 200 too."""
    with fuzz.server.client() as c:
        resp = c.put(f"/v1/pools/{POOL}", json={"limit": 1000, "queue_size": 0})
        assert resp.status_code in (200, 201), resp.text
        resp = c.post(f"/v1/pools/{POOL}/lock/acquire")
        assert resp.status_code == 200, resp.text
        return str(resp.json()["slot_id"])


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
@pytest.mark.parametrize("operation_id", ["acquireSlot", "renewSlot", "releaseSlot", "getPool"])
def test_slot_routes_on_a_live_slot(fuzz: Fuzz, live_slot: str, operation_id: str,
                                    mode: GenerationMode) -> None:
    names = {"pool": POOL, "slot_id": live_slot}
    path = next(r.path for r in ROUTES if r.operation_id == operation_id)
    fixed = {name: value for name, value in names.items() if "{" + name + "}" in path}
    checks = CHECKS if mode is GenerationMode.POSITIVE else NEGATIVE_CHECKS
    fuzz.run(operation_id, "member", mode, EXAMPLES["admin"], checks, fixed)


@pytest.mark.parametrize("operation_id", ["acquireLock", "renewLease", "releaseLease",
                                          "forceReleaseLock", "putPool", "createKey",
                                          "acquireSlot", "renewSlot", "releaseSlot"])
def test_the_fuzzer_reached_the_success_path(fuzz: Fuzz, operation_id: str,
                                             request: pytest.FixtureRequest) -> None:
    """The runs above are worth something only if valid input got 2xx answers too,
    not only refusals (run alone, this test makes its own run first)."""
    if operation_id not in fuzz.statuses:
        fixed = None
        if "Slot" in operation_id:
            fixed = {"pool": POOL, "slot_id": request.getfixturevalue("live_slot")}
            if operation_id == "acquireSlot":
                del fixed["slot_id"]
        fuzz.run(operation_id, "admin", GenerationMode.POSITIVE, EXAMPLES["admin"], CHECKS, fixed)
    seen = fuzz.statuses[operation_id]
    assert any(200 <= status < 300 for status in seen), f"{operation_id}: only {sorted(seen)}"
