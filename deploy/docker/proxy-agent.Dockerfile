# proxy-agent. Build from the repository root:
#   docker build -f deploy/docker/proxy-agent.Dockerfile -t proxy-agent .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p proxy-agent --bin proxy-agent

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/proxy-agent /proxy-agent
USER 65532:65532
ENTRYPOINT ["/proxy-agent"]
