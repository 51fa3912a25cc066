# tunnel-agent. Build from the repository root:
#   docker build -f deploy/docker/tunnel-agent.Dockerfile -t tunnel-agent .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p tunnel-agent --bin tunnel-agent

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/tunnel-agent /tunnel-agent
USER 65532:65532
ENTRYPOINT ["/tunnel-agent"]
