"""`speckv health`: a standard gRPC health-protocol probe (grpc.health.v1),
for container healthchecks and scripts. Exit 0 when SERVING, 1 otherwise.
With --tls-* (or SPECKV_TLS_*) it presents that certificate and checks the
server's against the address it dials (every server certificate names
loopback)."""
from __future__ import annotations

import argparse
import sys
from typing import Mapping, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from speckv.services.common.config import add_config_arguments, config_from
from speckv.services.common.rpc.tls import ClientTlsSettings, dial


def main(argv: Sequence[str], environ: Mapping[str, str]) -> int:
    parser = argparse.ArgumentParser(prog="speckv health", description=__doc__)
    parser.add_argument("--address", default=f"127.0.0.1:{environ.get('SPECKV_PORT', '50051')}",
                        help="host:port to probe (default 127.0.0.1:$SPECKV_PORT)")
    parser.add_argument("--service", default="", help="service name; empty = the whole server")
    parser.add_argument("--timeout-s", type=float, default=2.0)
    # In a container the service's own SPECKV_TLS_* apply: any certificate the CA signed may probe.
    add_config_arguments(parser, ClientTlsSettings)
    args = parser.parse_args(list(argv))
    with dial(args.address, config_from(ClientTlsSettings, args, environ).load()) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout_s)
        except grpc.RpcError as exc:
            print(f"{args.address}: {exc.code().name}", file=sys.stderr)
            return 1
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    print(f"{args.address}: {status}")
    return 0 if reply.status == health_pb2.HealthCheckResponse.SERVING else 1
