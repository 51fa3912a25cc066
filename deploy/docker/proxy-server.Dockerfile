# proxy-server. Build from the repository root:
#   docker build -f deploy/docker/proxy-server.Dockerfile -t proxy-server .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p proxy-server --bin proxy-server

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/proxy-server /proxy-server
USER 65532:65532
ENTRYPOINT ["/proxy-server"]
