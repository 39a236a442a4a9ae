# The manager image: built with the Rust toolchain, run from a minimal base as a non-root user.
#
#   docker build -t operator-manager:0.1.0 --build-arg REVISION=$(git rev-parse --short=12 HEAD) .
#
# The image name and tag match deploy/manager/deployment.yaml; to push elsewhere, build with your
# registry's name and run `kustomize edit set image operator-manager=<registry>/<name>:<tag>`
# in deploy/.

FROM rust:1.95-slim-bookworm AS build
# jemalloc, the manager's allocator, is built from C sources with make.
RUN apt-get update && apt-get install -y --no-install-recommends make && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds; the binary is copied out
# of the cached target directory so the next stage can reach it.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --package manager --bin manager \
    && cp target/release/manager /manager

# distroless/cc has glibc and CA certificates and nothing else: no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="operator-manager" \
      org.opencontainers.image.description="Runs every registered controller in one process behind leader election, with metrics and health probes." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://git.operator-platform.example/operator-manager" \
      org.opencontainers.image.url="https://git.operator-platform.example/operator-manager" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /manager /manager
# Numeric so the kubelet can verify runAsNonRoot.
USER 65532:65532
# Metrics (HTTPS), health probes, admission webhooks: what the Deployment uses.
EXPOSE 8443 8081 9443
ENTRYPOINT ["/manager"]
