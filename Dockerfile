# One image for every subcommand: sless serve, gateway, queue, processor.
#   docker build -t ghcr.io/kube5s/sless:latest .
# Runs as a non-root user (65532) and writes nothing outside its volumes,
# so pods can keep their root filesystem read-only.

FROM rust:1.95-bookworm AS build
# librdkafka is built from its bundled source: make, pkg-config, and the
# OpenSSL and zlib headers. protoc is not needed (protox compiles protos).
RUN apt-get update \
 && apt-get install -y --no-install-recommends make pkg-config libssl-dev zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p sless \
 && install -D -m 0755 target/release/sless /out/sless

FROM debian:bookworm-slim
# The runtime of the binary: OpenSSL (librdkafka's TLS), zlib, CA roots.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/sless /usr/local/bin/sless
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/sless"]
CMD ["--help"]
