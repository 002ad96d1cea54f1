# Both binaries in one minimal, non-root image. Build: docker build -t appservice-operator .
#
# Base images are pinned by digest (the tag stays for readers; the digest decides), so a
# rebuild starts from the bytes that were reviewed. To move to newer images, resolve the
# tag to its digest (`docker buildx imagetools inspect rust:1.95-bookworm`, `crane digest
# gcr.io/distroless/cc-debian12:nonroot`) and update both lines together.
FROM rust:1.95-bookworm@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
WORKDIR /src
# The build context holds only what this build needs (.dockerignore is an allow-list).
COPY . .
RUN cargo build --release --locked -p appservice-webhook -p appservice-controller \
 && install -D -m 0755 target/release/appservice-webhook /out/appservice-webhook \
 && install -D -m 0755 target/release/appservice-controller /out/appservice-controller \
 && install -D -m 0755 target/release/appservice-migrate-storage /out/appservice-migrate-storage

# distroless/cc: glibc and CA certificates, no shell; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot@sha256:9dac0a79194e45a7da0158a9c6da57b217585af0786db3845d1f0ec1a0dd182f
COPY --from=build /out/ /usr/local/bin/
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/appservice-controller"]
