# Multi-stage build: compile in the Rust image, run in a slim Debian as a numeric
# non-root user (10001), so a runtime that enforces runAsNonRoot can check it without
# reading /etc/passwd.
FROM rust:1-bookworm AS build
WORKDIR /src

# Dependencies first, in their own layer: the manifests and stub sources of every
# workspace member, built once. A change to tokenmint's own code reuses this layer.
COPY Cargo.toml Cargo.lock ./
COPY bench/Cargo.toml bench/Cargo.toml
COPY test-support/Cargo.toml test-support/Cargo.toml
RUN mkdir -p src bench/src test-support/src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs test-support/src/lib.rs \
 && echo 'fn main() {}' > bench/src/main.rs \
 && cargo build --release --locked --bin tokenmint \
 && rm -rf src bench/src test-support/src

# Then the real sources. Touched, so cargo rebuilds tokenmint over the stub even when
# the copied files are older than the stub's build.
COPY src src
COPY bench bench
COPY test-support test-support
COPY config config
COPY migrations migrations
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin tokenmint

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY --from=build /src/target/release/tokenmint /usr/local/bin/tokenmint
USER 10001:10001
ENV TOKENMINT_ENV=production \
    TOKENMINT__SERVER__BIND=0.0.0.0:8080 \
    TOKENMINT__LOG__FORMAT=json
EXPOSE 8080
# The binary checks itself: GET /readyz on server.bind (no curl or wget in the image).
HEALTHCHECK --interval=10s --timeout=6s --start-period=30s --retries=3 \
    CMD ["tokenmint", "healthcheck"]
ENTRYPOINT ["tokenmint"]
CMD ["serve"]
