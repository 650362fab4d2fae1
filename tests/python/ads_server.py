#!/usr/bin/env python3
"""A small ADS control plane serving RateLimitConfig resources, for tollgate's tests.

Shares no code with tollgate's xDS client: grpcio and the ``xds-protos`` stubs for
the discovery service, and envoyproxy/ratelimit's ``RateLimitConfig`` message built
here at run time from its published field numbers (``xds-protos`` lacks it).

    $TOLLGATE_PYTHON tests/python/ads_server.py --port PORT [--node-id ID]
        [--cert PEM --key PEM [--client-ca PEM]]

Controlled by JSON lines on stdin:

    {"op": "set", "version": "v1", "resources": [RateLimitConfig as proto JSON]}
        serve this whole set to every stream, now and to every new stream;
        add "garbage": "name" to append a resource whose bytes do not decode.
    {"op": "quit"}

Reports JSON lines on stdout (flushed): ``listening``, ``stream_open`` (node,
headers), ``request`` (version_info, response_nonce, error_detail, type_url),
``sent`` (version, nonce) and ``stream_closed``. With ``--node-id`` only that node
is answered, as Envoy Gateway answers only ``envoy-ratelimit``. With
``--client-ca`` a client certificate signed by it is required (mTLS).
"""

import argparse
import itertools
import json
import queue
import sys
import threading
from concurrent import futures

import grpc
from google.protobuf import any_pb2, descriptor_pb2, descriptor_pool, json_format
from google.protobuf import message_factory, struct_pb2  # noqa: F401 (registers Struct)

from envoy.service.discovery.v3 import ads_pb2_grpc, discovery_pb2

TYPE_URL = "type.googleapis.com/ratelimit.config.ratelimit.v3.RateLimitConfig"
PACKAGE = "ratelimit.config.ratelimit.v3"

F = descriptor_pb2.FieldDescriptorProto


def rate_limit_config_class():
    """envoyproxy/ratelimit's api/ratelimit/config/ratelimit/v3/rls_conf.proto."""
    fdp = descriptor_pb2.FileDescriptorProto(
        name="ratelimit/config/ratelimit/v3/rls_conf.proto",
        package=PACKAGE,
        syntax="proto3",
        dependency=["google/protobuf/struct.proto"],
    )

    def message(name, fields):
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = type_name

    opt, rep = F.LABEL_OPTIONAL, F.LABEL_REPEATED
    own = "." + PACKAGE + "."
    message("RateLimitConfig", [
        ("name", 1, F.TYPE_STRING, opt, None),
        ("domain", 2, F.TYPE_STRING, opt, None),
        ("descriptors", 3, F.TYPE_MESSAGE, rep, own + "RateLimitDescriptor"),
    ])
    message("RateLimitDescriptor", [
        ("key", 1, F.TYPE_STRING, opt, None),
        ("value", 2, F.TYPE_STRING, opt, None),
        ("rate_limit", 3, F.TYPE_MESSAGE, opt, own + "RateLimitPolicy"),
        ("descriptors", 4, F.TYPE_MESSAGE, rep, own + "RateLimitDescriptor"),
        ("shadow_mode", 5, F.TYPE_BOOL, opt, None),
        ("detailed_metric", 6, F.TYPE_BOOL, opt, None),
        ("quota_mode", 7, F.TYPE_BOOL, opt, None),
        ("metadata", 8, F.TYPE_MESSAGE, opt, ".google.protobuf.Struct"),
    ])
    message("RateLimitPolicy", [
        ("unit", 1, F.TYPE_ENUM, opt, own + "RateLimitUnit"),
        ("requests_per_unit", 2, F.TYPE_UINT32, opt, None),
        ("unlimited", 3, F.TYPE_BOOL, opt, None),
        ("name", 4, F.TYPE_STRING, opt, None),
        ("replaces", 5, F.TYPE_MESSAGE, rep, own + "RateLimitReplace"),
    ])
    message("RateLimitReplace", [("name", 1, F.TYPE_STRING, opt, None)])
    unit = fdp.enum_type.add(name="RateLimitUnit")
    for name, number in [("UNKNOWN", 0), ("SECOND", 1), ("MINUTE", 2), ("HOUR", 3),
                         ("DAY", 4), ("WEEK", 7), ("MONTH", 5), ("YEAR", 6)]:
        unit.value.add(name=name, number=number)
    pool = descriptor_pool.Default()
    pool.Add(fdp)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(PACKAGE + ".RateLimitConfig"))


RateLimitConfig = rate_limit_config_class()


def emit(event, **fields):
    fields["event"] = event
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


class State:
    """The set served now and the open streams' queues."""

    def __init__(self):
        self.lock = threading.Lock()
        self.version = None
        self.resources = []
        self.streams = []
        self.nonces = itertools.count(1)

    def set(self, version, resources):
        with self.lock:
            self.version, self.resources = version, resources
            streams = list(self.streams)
        for q in streams:
            q.put("push")


class Ads(ads_pb2_grpc.AggregatedDiscoveryServiceServicer):
    def __init__(self, state, node_id):
        self.state = state
        self.node_id = node_id

    def StreamAggregatedResources(self, request_iterator, context):
        wake = queue.Queue()
        headers = {k: v for k, v in context.invocation_metadata() if isinstance(v, str)}
        node = {}

        def read():
            try:
                for request in request_iterator:
                    if request.HasField("node"):
                        node["id"] = request.node.id
                        node["metadata"] = json_format.MessageToDict(request.node.metadata)
                        emit("stream_open", node=node, headers=headers)
                    detail = None
                    if request.HasField("error_detail"):
                        detail = {"code": request.error_detail.code,
                                  "message": request.error_detail.message}
                    emit("request", version_info=request.version_info,
                         response_nonce=request.response_nonce,
                         type_url=request.type_url, error_detail=detail)
                    if not request.response_nonce:
                        wake.put("subscribe")
            except Exception:  # the stream ended under us
                pass
            finally:
                wake.put(None)

        with self.state.lock:
            self.state.streams.append(wake)
        threading.Thread(target=read, daemon=True).start()
        try:
            while True:
                item = wake.get()
                if item is None or not context.is_active():
                    break
                if self.node_id is not None and node.get("id") != self.node_id:
                    continue
                with self.state.lock:
                    version, resources = self.state.version, list(self.state.resources)
                    nonce = str(next(self.state.nonces))
                if version is None:
                    continue
                yield discovery_pb2.DiscoveryResponse(
                    version_info=version, resources=resources, type_url=TYPE_URL, nonce=nonce)
                emit("sent", version=version, nonce=nonce)
        finally:
            with self.state.lock:
                self.state.streams.remove(wake)
            emit("stream_closed")


def pack(resource_json):
    message = json_format.ParseDict(resource_json, RateLimitConfig())
    return any_pb2.Any(type_url=TYPE_URL, value=message.SerializeToString())


def control(state, server):
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        command = json.loads(line)
        op = command.get("op")
        if op == "set":
            resources = [pack(r) for r in command.get("resources", [])]
            if command.get("garbage"):
                # A length-delimited field 1 (name) claiming more bytes than follow.
                resources.append(any_pb2.Any(type_url=TYPE_URL, value=b"\x0a\x7fbroken"))
            state.set(command["version"], resources)
            emit("set", version=command["version"], resources=len(resources))
        elif op == "quit":
            break
        else:
            emit("error", message=f"unknown op {op!r}")
    server.stop(grace=0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--node-id")
    parser.add_argument("--cert")
    parser.add_argument("--key")
    parser.add_argument("--client-ca")
    args = parser.parse_args()
    state = State()
    # Envoy Gateway's xDS server is grpc-go with no keepalive enforcement policy: a
    # client ping is allowed at most every 5 minutes, none without a call, and the
    # third early one ends the connection with GOAWAY too_many_pings. Holding clients
    # to the same rules keeps a pinging client from passing here and failing there
    # (the tests are too short to reach a second early ping, so this is realism,
    # not a check).
    options = [
        ("grpc.http2.min_ping_interval_without_data_ms", 5 * 60 * 1000),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.keepalive_permit_without_calls", 0),
    ]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options)
    ads_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server(Ads(state, args.node_id), server)
    address = f"127.0.0.1:{args.port}"
    if args.cert:
        with open(args.cert, "rb") as c, open(args.key, "rb") as k:
            pair = (k.read(), c.read())
        ca = None
        if args.client_ca:
            with open(args.client_ca, "rb") as f:
                ca = f.read()
        credentials = grpc.ssl_server_credentials(
            [pair], root_certificates=ca, require_client_auth=ca is not None)
        port = server.add_secure_port(address, credentials)
    else:
        port = server.add_insecure_port(address)
    if port == 0:
        emit("error", message=f"cannot listen on {address}")
        sys.exit(2)
    server.start()
    emit("listening", port=port)
    control(state, server)


if __name__ == "__main__":
    main()
