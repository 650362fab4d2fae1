# syntax=docker/dockerfile:1
# tollgate's image: built in the official Rust image, run on Debian slim as an
# unprivileged user (uid 10001), nothing else installed. No OpenSSL (TLS to Redis is
# rustls) and no protoc (build.rs compiles the protos with protox).
#
#   docker build -t tollgate:local --build-arg TOLLGATE_COMMIT=$(git rev-parse --short HEAD) .
#   docker run --rm -p 8081:8081 -p 8080:8080 tollgate:local      # in-memory counters
#
# The build compiles tollgate with its release profile (whole-program LTO, one
# codegen unit): the build step alone took 23m31s cold on a 2-core machine busy with
# other builds (docs/kubernetes-and-envoy.md, "Building and hosting the image"), and
# the image first installs the toolchain rust-toolchain.toml pins. For trying it,
# `--build-arg PROFILE=quick` builds without optimisation (5m29s there), as
# docker-compose.yml does. TOLLGATE_COMMIT is what `tollgate --version` and
# tollgate_build_info name (`unknown` without it: .git stays out of the context).
#
# The image carries config/ as /srv/tollgate/config; mount your own directory there
# (docker-compose.yml) or point RUNTIME_ROOT/RUNTIME_SUBDIRECTORY at a mount and run
# plain `serve` (deploy/kubernetes/deployment.yaml). Debian rather than distroless:
# the Kubernetes preStop hook runs `sleep`, and docker-compose.yml's healthcheck asks
# GET /healthcheck with bash's /dev/tcp (there is no curl or wget here).
#
# Envoy Gateway (and envoyproxy/ratelimit's own manifests) run `/bin/ratelimit` with
# no arguments, as uid 65534 on a read-only root filesystem: /bin/ratelimit is a
# symlink to tollgate, which under that name with no subcommand serves as upstream's
# binary does (settings from the environment, debug port 6070 on). Nothing is written
# at run time, and every file here is readable by any uid (docs/envoy-gateway.md).

ARG RUST_VERSION=1

FROM rust:${RUST_VERSION}-slim-bookworm AS build
# `release` for production; `quick` to try it (see above). The profile's name is its
# directory under target/.
ARG PROFILE=release
ARG TOLLGATE_COMMIT=unknown
WORKDIR /src
# .dockerignore keeps target/, .venv/ and .git/ out of the context.
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    TOLLGATE_COMMIT="${TOLLGATE_COMMIT}" cargo build --profile "${PROFILE}" --locked --bin tollgate \
    && install -D -m 0755 "target/${PROFILE}/tollgate" /out/tollgate

FROM debian:bookworm-slim AS runtime
RUN groupadd --system --gid 10001 tollgate \
    && useradd --system --uid 10001 --gid tollgate --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin tollgate
COPY --from=build /out/tollgate /usr/local/bin/tollgate
# The path Envoy Gateway's Deployment runs (on bookworm's merged /usr, /usr/bin too).
RUN ln -s /usr/local/bin/tollgate /bin/ratelimit
COPY config/ /srv/tollgate/config/
WORKDIR /srv/tollgate
USER 10001:10001
# gRPC (RateLimitService, grpc.health.v1, reflection) and HTTP (/healthcheck, /json,
# /metrics, /rlconfig, /config.json); docs/operations.md says how to restrict them.
# As /bin/ratelimit also the debug port 6070 (/rlconfig, /config.json), and with
# PROMETHEUS_ADDR (Envoy Gateway: :19001) a metrics port of its own.
EXPOSE 8081 8080
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve", "--config", "/srv/tollgate/config"]
