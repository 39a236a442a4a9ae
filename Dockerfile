# The manager image: built with the Rust toolchain, run from a minimal base as a non-root user.
#
#   docker build -t operator-manager:0.1.0 .
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
COPY --from=build /manager /manager
# Numeric so the kubelet can verify runAsNonRoot.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/manager"]
