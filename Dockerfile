# Multi-stage build: compile in the Rust image, run in a slim Debian as a non-root user.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
# The workspace's other member (the benchmark); not built here, but the manifest must exist.
COPY bench bench
COPY config config
COPY migrations migrations
RUN cargo build --release --locked --bin tokenmint

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /app tokenmint
WORKDIR /app
COPY --from=build /src/target/release/tokenmint /usr/local/bin/tokenmint
USER tokenmint
ENV TOKENMINT_ENV=production \
    TOKENMINT__SERVER__BIND=0.0.0.0:8080 \
    TOKENMINT__LOG__FORMAT=json
EXPOSE 8080
ENTRYPOINT ["tokenmint"]
CMD ["serve"]
