#!/usr/bin/env python3
"""Independent-client wire-compatibility test for tollgate.

Run by the Rust test ``tests/interop_python.rs`` as

    $TOLLGATE_PYTHON tests/python/interop.py 127.0.0.1:PORT

against a tollgate server serving ``tests/fixtures/interop/interop.yaml``
(domain ``interop``) with a fresh in-memory store and the real wall clock.

The client deliberately shares no code with the Rust side: it uses only
grpcio and the Python stubs that the ``xds-protos`` package generates from
Envoy's own .proto files (``envoy.service.ratelimit.v3.rls_pb2`` /
``rls_pb2_grpc``, ``envoy.extensions.common.ratelimit.v3.ratelimit_pb2``).
So a passing run shows that tollgate speaks
``envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit`` as Envoy's
schema defines it, not merely as tollgate's own generated code reads it.

Each check is one small function. Descriptor values carry a random
(uuid4 hex) suffix so repeated runs against one server never collide.
The script stops at the first failed check with a message naming it and
exits 1; on success it prints ``N passed, 0 failed`` and exits 0.
A connection failure exits 2, as does a usage error.
"""

import sys
import uuid

import grpc
from google.protobuf import unknown_fields, wrappers_pb2

from envoy.extensions.common.ratelimit.v3 import ratelimit_pb2
from envoy.service.ratelimit.v3 import rls_pb2, rls_pb2_grpc

DEADLINE_S = 5.0
DOMAIN = "interop"
RUN = uuid.uuid4().hex

Response = rls_pb2.RateLimitResponse
OK = Response.Code.OK  # 1
OVER_LIMIT = Response.Code.OVER_LIMIT  # 2
Unit = Response.RateLimit.Unit  # SECOND=1 MINUTE=2 HOUR=3 DAY=4 MONTH=5 YEAR=6 WEEK=7

# RateLimitDescriptor.RateLimitOverride.unit is an envoy.type.v3.RateLimitUnit,
# which has no WEEK (it stops at YEAR=6); the response enum has WEEK=7. The
# numbers agree, and proto3 enums are open, so WEEK goes on the wire as 7.
OVERRIDE_UNIT_WEEK = 7

MAX_UINT32 = 4294967295
DAY_S = 86400


class CheckFailed(Exception):
    """One expectation of a check did not hold."""


def expect(cond, msg):
    if not cond:
        raise CheckFailed(msg)


def expect_eq(what, got, want):
    expect(got == want, f"{what}: got {got!r}, want {want!r}")


def code_name(code):
    try:
        return Response.Code.Name(code)
    except ValueError:
        return str(code)


def unit_name(unit):
    try:
        return Unit.Name(unit)
    except ValueError:
        return str(unit)


def rand(tag):
    """A descriptor value unique to this run."""
    return f"{tag}-{RUN}"


def descriptor(*entries, hits_addend=None, limit=None):
    """RateLimitDescriptor from (key, value) pairs; hits_addend is the
    per-descriptor google.protobuf.UInt64Value (None = unset)."""
    d = ratelimit_pb2.RateLimitDescriptor(
        entries=[ratelimit_pb2.RateLimitDescriptor.Entry(key=k, value=v) for k, v in entries]
    )
    if hits_addend is not None:
        d.hits_addend.CopyFrom(wrappers_pb2.UInt64Value(value=hits_addend))
    if limit is not None:
        d.limit.CopyFrom(limit)
    return d


def request(*descriptors, domain=DOMAIN, hits_addend=0):
    return rls_pb2.RateLimitRequest(
        domain=domain, descriptors=list(descriptors), hits_addend=hits_addend
    )


def call(stub, req):
    """ShouldRateLimit with the 5 s deadline; an RPC error fails the check."""
    try:
        return stub.ShouldRateLimit(req, timeout=DEADLINE_S)
    except grpc.RpcError as e:
        raise CheckFailed(f"RPC failed: {e.code().name}: {e.details()!r}") from None


def call_expecting_error(stub, req):
    """ShouldRateLimit that must fail; returns the grpc.RpcError."""
    try:
        resp = stub.ShouldRateLimit(req, timeout=DEADLINE_S)
    except grpc.RpcError as e:
        return e
    raise CheckFailed(f"expected an RPC error, got a response: {resp}")


def one_status(resp, what):
    expect_eq(f"{what}: number of statuses", len(resp.statuses), 1)
    return resp.statuses[0]


def expect_status(what, resp, *, overall, code, remaining=None):
    expect_eq(f"{what}: overall_code", code_name(resp.overall_code), code_name(overall))
    st = one_status(resp, what)
    expect_eq(f"{what}: status code", code_name(st.code), code_name(code))
    if remaining is not None:
        expect_eq(f"{what}: limit_remaining", st.limit_remaining, remaining)
    return st


def expect_limit(what, st, *, rpu, unit, name=None):
    expect(st.HasField("current_limit"), f"{what}: current_limit missing")
    expect_eq(f"{what}: current_limit.requests_per_unit", st.current_limit.requests_per_unit, rpu)
    expect_eq(f"{what}: current_limit.unit", unit_name(st.current_limit.unit), unit_name(unit))
    if name is not None:
        expect_eq(f"{what}: current_limit.name", st.current_limit.name, name)


def expect_reset_within(what, st, max_s):
    expect(st.HasField("duration_until_reset"), f"{what}: duration_until_reset missing")
    secs = st.duration_until_reset.seconds
    expect(0 < secs <= max_s, f"{what}: duration_until_reset.seconds = {secs}, want in (0, {max_s}]")


# --- checks ---------------------------------------------------------------


def check_a_basic_day_limit(stub):
    """[client=<rand>] at 3/day: OK with remaining 2, 1, 0; then OVER_LIMIT."""
    req = request(descriptor(("client", rand("a"))))
    for i, want_remaining in enumerate([2, 1, 0], start=1):
        what = f"call {i}"
        st = expect_status(what, call(stub, req), overall=OK, code=OK, remaining=want_remaining)
        expect_limit(what, st, rpu=3, unit=Unit.DAY)
        expect_reset_within(what, st, DAY_S)
    st = expect_status("call 4", call(stub, req), overall=OVER_LIMIT, code=OVER_LIMIT, remaining=0)
    expect_limit("call 4", st, rpu=3, unit=Unit.DAY)
    expect_reset_within("call 4", st, DAY_S)


def check_b_unknown_domain(stub):
    """Unknown domain: OK with one status that carries no current_limit."""
    resp = call(stub, request(descriptor(("client", rand("b"))), domain="nope"))
    st = expect_status("domain nope", resp, overall=OK, code=OK)
    expect(not st.HasField("current_limit"), f"domain nope: unexpected current_limit {st.current_limit}")


def check_c_unlimited(stub):
    """[unl=x] is unlimited: OK, no current_limit, limit_remaining = u32::MAX."""
    resp = call(stub, request(descriptor(("unl", "x"))))
    st = expect_status("unl=x", resp, overall=OK, code=OK, remaining=MAX_UINT32)
    expect(not st.HasField("current_limit"), f"unl=x: unexpected current_limit {st.current_limit}")


def check_d_hits_addend(stub):
    """Request-level and per-descriptor hits_addend on [hits=<rand>] (10/day)."""
    entry = ("hits", rand("d"))

    resp = call(stub, request(descriptor(entry), hits_addend=4))
    expect_status("request hits_addend=4", resp, overall=OK, code=OK, remaining=6)

    resp = call(stub, request(descriptor(entry, hits_addend=5), hits_addend=1))
    expect_status("descriptor hits_addend=5 (request 1)", resp, overall=OK, code=OK, remaining=1)

    for i in (1, 2):
        resp = call(stub, request(descriptor(entry, hits_addend=0)))
        expect_status(f"descriptor hits_addend=0 (check only) #{i}", resp, overall=OK, code=OK, remaining=1)

    resp = call(stub, request(descriptor(entry, hits_addend=2)))
    expect_status("descriptor hits_addend=2", resp, overall=OVER_LIMIT, code=OVER_LIMIT, remaining=0)

    resp = call(stub, request(descriptor(entry, hits_addend=1)))
    expect_status(
        "descriptor hits_addend=1 after a denied request (which must consume nothing)",
        resp, overall=OK, code=OK, remaining=0,
    )


def check_e_two_descriptors(stub):
    """Two descriptors in one request: statuses come back in request order."""
    resp = call(stub, request(descriptor(("client", rand("e"))), descriptor(("named", "fixed"))))
    expect_eq("number of statuses", len(resp.statuses), 2)
    first, second = resp.statuses
    expect_eq("statuses[0] code", code_name(first.code), code_name(OK))
    expect_eq("statuses[0] limit_remaining", first.limit_remaining, 2)
    expect_limit("statuses[0]", first, rpu=3, unit=Unit.DAY)
    # named=fixed is shared by every run against this server, so its code and
    # remaining count are not checked; its rule is.
    expect_limit("statuses[1]", second, rpu=5, unit=Unit.HOUR, name="named_rule")


def check_f_limit_override(stub):
    """A descriptor's `limit` override (1/week) replaces the configured 3/day."""
    override = ratelimit_pb2.RateLimitDescriptor.RateLimitOverride(
        requests_per_unit=1, unit=OVERRIDE_UNIT_WEEK
    )
    req = request(descriptor(("client", rand("f")), limit=override))
    st = expect_status("override call 1", call(stub, req), overall=OK, code=OK)
    expect_limit("override call 1", st, rpu=1, unit=Unit.WEEK)
    expect_eq("override call 1: unit number", st.current_limit.unit, 7)
    expect_status("override call 2", call(stub, req), overall=OVER_LIMIT, code=OVER_LIMIT)


def check_g_invalid_requests(stub):
    """Malformed requests are rejected with INVALID_ARGUMENT and a message."""
    cases = [
        ("empty domain", request(descriptor(("client", rand("g"))), domain="")),
        ("no descriptors", request()),
        ("descriptor entry with empty key", request(descriptor(("", rand("g"))))),
    ]
    for what, req in cases:
        err = call_expecting_error(stub, req)
        expect_eq(f"{what}: gRPC status", err.code(), grpc.StatusCode.INVALID_ARGUMENT)
        expect(bool(err.details()), f"{what}: INVALID_ARGUMENT without a details message")


def _no_unknown_fields(msg, path):
    """Every field tollgate sent must be one Envoy's schema knows."""
    unknown = unknown_fields.UnknownFieldSet(msg)
    expect(
        len(unknown) == 0,
        f"{path}: {len(unknown)} field(s) unknown to Envoy's schema: "
        + ", ".join(f"#{f.field_number} (wire type {f.wire_type})" for f in unknown),
    )
    for field, value in msg.ListFields():
        if field.message_type is None:
            continue
        if field.message_type.GetOptions().map_entry:
            if field.message_type.fields_by_name["value"].message_type is not None:
                for key, item in value.items():
                    _no_unknown_fields(item, f"{path}.{field.name}[{key!r}]")
        elif field.is_repeated:
            for i, item in enumerate(value):
                _no_unknown_fields(item, f"{path}.{field.name}[{i}]")
        else:
            _no_unknown_fields(value, f"{path}.{field.name}")


def check_h_wire_fields(stub):
    """Response wire format: parses, optional fields readable, no unknown fields.

    raw_body, response_headers_to_add, request_headers_to_add,
    dynamic_metadata and quota are read, the response must round-trip through
    serialization, and it must carry no field Envoy's schema does not know
    (which would mean a wrong field number on the Rust side).
    """
    resp = call(stub, request(descriptor(("client", rand("h")))))
    _ = resp.raw_body
    _ = list(resp.response_headers_to_add)
    _ = list(resp.request_headers_to_add)
    _ = resp.dynamic_metadata
    _ = resp.HasField("dynamic_metadata")
    _ = resp.quota
    _no_unknown_fields(resp, "RateLimitResponse")
    again = Response.FromString(resp.SerializeToString())
    expect(again == resp, "response does not round-trip through serialization")


CHECKS = [
    check_a_basic_day_limit,
    check_b_unknown_domain,
    check_c_unlimited,
    check_d_hits_addend,
    check_e_two_descriptors,
    check_f_limit_override,
    check_g_invalid_requests,
    check_h_wire_fields,
]


def main(argv):
    if len(argv) != 2:
        print(f"usage: {argv[0]} HOST:PORT", file=sys.stderr)
        return 2
    addr = argv[1]

    with grpc.insecure_channel(addr) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=DEADLINE_S)
        except grpc.FutureTimeoutError:
            print(f"FAIL: cannot connect to {addr} within {DEADLINE_S:g}s", file=sys.stderr)
            return 2
        stub = rls_pb2_grpc.RateLimitServiceStub(channel)

        passed = 0
        for check in CHECKS:
            try:
                check(stub)
            except CheckFailed as e:
                sys.stdout.flush()
                print(f"FAIL {check.__name__}: {e}", file=sys.stderr)
                print(f"  ({check.__doc__.splitlines()[0]})", file=sys.stderr)
                print(f"{passed} passed, 1 failed")
                return 1
            print(f"ok   {check.__name__}")
            passed += 1

    print(f"{passed} passed, 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
