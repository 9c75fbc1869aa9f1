"""gRPC plumbing shared by the service processes: the server, its interceptor, TLS and authz, telemetry and /metrics, proto conversion; domain cores never import it."""
