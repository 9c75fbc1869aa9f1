# One image for every speckv service; the command picks the service:
#   docker run speckv kvstore --port 50051
# It installs the service package alone (`pip install .`, no extra): what a service
# process imports, without the lab's torch, matplotlib, statsmodels or Ray. The lab
# commands (speckv simulate, bench, demo, ...) say they need `speckv[lab]`.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1

WORKDIR /opt/speckv
COPY pyproject.toml README.md ./
COPY protos ./protos
COPY services ./services
COPY kernels ./kernels
# The lab's code ships in the same wheel (one package list); its dependencies do not.
COPY loadgen ./loadgen
# No SPECKV_HOST here: a service binds loopback unless it is given TLS files
# (docker-compose.yml makes them) or --insecure (docs/security.md).
# /certs and /state exist owned by speckv, so a fresh volume mounted on either is writable
# (/state: the scheduler's durable control state in docker-compose.yml).
RUN pip install . && useradd --system --uid 10001 speckv && mkdir /certs /state && chown speckv /certs /state
USER speckv

# Traces are mounted, never baked in: -v /path/to/traces:/traces
ENV SPECKV_TRACES=/traces
ENTRYPOINT ["speckv"]
CMD ["--help"]
