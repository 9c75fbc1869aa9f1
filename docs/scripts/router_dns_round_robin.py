"""A check, not a benchmark: a RoutingClient given ONE channel on gRPC's own
dns resolver with round_robin (docs/replicas.md, "Routers", way 2) spreads
Route over every scheduler the name resolves to, and keeps being answered
when one stops. Two real schedulers at the same port, one on 127.0.0.1 and
one on [::1]; gRPC resolves `localhost` to both (even where /etc/hosts names
only 127.0.0.1). Prints how many of 40 routes each scheduler answered
(node n4: the IPv4 one, n6: the IPv6 one; `fallback` would mean unanswered),
then again after the IPv6 one stopped:

    PYTHONPATH=. .venv/bin/python docs/scripts/router_dns_round_robin.py
"""
import collections

import grpc

from speckv.services.client.routing import SCHEDULER_CHANNEL_OPTIONS, RoutingClient
from speckv.services.cluster.ports import free_ports
from tests.support.scheduler_service import register, scheduler


def tally(client: RoutingClient, prefix: str) -> collections.Counter:
    seen: collections.Counter = collections.Counter()
    for i in range(40):
        routed = client.route(f"{prefix}{i}", [], 16)
        seen[(routed.node_id, routed.source.value)] += 1
        client.done(f"{prefix}{i}")
    return seen


port = free_ports(1)[0]
with scheduler(policy="none", port=port, host="127.0.0.1", confirm_routes=False) as (_, v4), \
        scheduler(policy="none", port=port, host="[::1]", confirm_routes=False) as (v6_server, v6):
    register(v4, "n4", "127.0.0.1:1")
    register(v6, "n6", "127.0.0.1:1")
    channel = grpc.insecure_channel(f"dns:///localhost:{port}",
                                    options=[("grpc.lb_policy_name", "round_robin"), *SCHEDULER_CHANNEL_OPTIONS])
    client = RoutingClient(channel)
    print("both up:", dict(tally(client, "a")))
    v6_server.stop(grace_s=0.1)
    print("[::1] stopped:", dict(tally(client, "b")))
    client.close()
    channel.close()
