# Both binaries in one minimal, non-root image. Build: docker build -t appservice-operator .
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p appservice-webhook -p appservice-controller \
 && install -D -m 0755 target/release/appservice-webhook /out/appservice-webhook \
 && install -D -m 0755 target/release/appservice-controller /out/appservice-controller \
 && install -D -m 0755 target/release/appservice-migrate-storage /out/appservice-migrate-storage

# distroless/cc: glibc and CA certificates, no shell; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/appservice-controller"]
