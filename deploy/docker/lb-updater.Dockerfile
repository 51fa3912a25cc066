# lb-updater. Build from the repository root:
#   docker build -f deploy/docker/lb-updater.Dockerfile -t lb-updater .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p lb-updater --bin lb-updater

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/lb-updater /lb-updater
USER 65532:65532
ENTRYPOINT ["/lb-updater"]
