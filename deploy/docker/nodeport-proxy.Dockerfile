# nodeport-proxy. Build from the repository root:
#   docker build -f deploy/docker/nodeport-proxy.Dockerfile -t nodeport-proxy .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p nodeport-proxy --bin nodeport-proxy

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/nodeport-proxy /nodeport-proxy
USER 65532:65532
ENTRYPOINT ["/nodeport-proxy"]
