# The Sallyport image: `sallyport`, `sally` and `sallyctl` on Debian bookworm (slim).
#
#   docker build -t sallyport .
#   docker run --rm sallyport configure              # the entrypoint is `sallyport`
#
# The image runs as the unprivileged user `sallyport` (uid 10001), data in /var/lib/sallyport:
# right for auth and the proxy. A node agent (`start --roles=node`) must run as root (`docker
# run --user root`, `user: root` in compose): it starts every session as the login the person
# asked for (setuid/setgid, PAM, utmp), which only root may do. docker-compose.yml runs the
# whole topology from this one image.

# The toolchain at the workspace's rust-version (Cargo.toml).
FROM rust:1.94-bookworm AS build
WORKDIR /src
COPY . .
# BuildKit (Docker's default builder since 23.0) keeps the registry and target dir between
# builds; the binaries are copied out of the cache mount in the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bins \
    && mkdir -p /out \
    && cp target/release/sallyport target/release/sally target/release/sallyctl /out/

FROM debian:bookworm-slim
# ca-certificates: S3 and OpenID providers over HTTPS; curl: the compose healthchecks (the
# diagnostics listener); openssh-sftp-server: sftp and scp -s on a node.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        ca-certificates curl openssh-sftp-server \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 sallyport \
    && useradd --system --uid 10001 --gid sallyport --home-dir /var/lib/sallyport \
        --shell /usr/sbin/nologin sallyport \
    && install -d -m 0700 -o sallyport -g sallyport /var/lib/sallyport
COPY --from=build /out/ /usr/local/bin/
USER sallyport
WORKDIR /var/lib/sallyport
# 3023 SSH (users, ProxyJump), 3024 agents' tunnels, 3025 auth, 3026 Kubernetes, 3080 web.
EXPOSE 3023 3024 3025 3026 3080
ENTRYPOINT ["sallyport"]
# Give it a command: `start --config FILE` with a mounted config (see config/compose/).
CMD ["--help"]
