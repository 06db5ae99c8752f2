# Images of servercount's binaries: each a static binary on an empty base,
# run as a non-root user, at the path upstream's images use. The Makefile
# cross-compiles the binaries into bin/linux_<arch>/ first (make images),
# so no base image is pulled and nothing runs at build time:
#
#   docker build --target proxy-server --platform linux/amd64 .
#   buildah bud --target proxy-agent --platform linux/arm64 .
FROM scratch AS base
ARG VERSION=devel
ARG REVISION=unknown
LABEL org.opencontainers.image.source="https://github.com/servercount/servercount" \
      org.opencontainers.image.url="https://github.com/servercount/servercount" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.vendor="servercount"
# 65532 is the "nonroot" user of distroless images.
USER 65532:65532

# The binaries make cross built for the platform of the image, which each
# image below takes its own from.
FROM scratch AS binaries
ARG TARGETARCH
COPY bin/linux_${TARGETARCH}/ /

FROM base AS proxy-server
LABEL org.opencontainers.image.title="proxy-server" \
      org.opencontainers.image.description="Konnectivity proxy-server that counts its peers through DNS or Leases"
COPY --from=binaries /proxy-server /proxy-server
ENTRYPOINT ["/proxy-server"]

FROM base AS proxy-agent
LABEL org.opencontainers.image.title="proxy-agent" \
      org.opencontainers.image.description="Konnectivity proxy-agent that connects to every proxy-server it counts"
COPY --from=binaries /proxy-agent /proxy-agent
ENTRYPOINT ["/proxy-agent"]

FROM base AS servercount
LABEL org.opencontainers.image.title="servercount" \
      org.opencontainers.image.description="dig-style probe: how many servers stand behind a DNS name"
COPY --from=binaries /servercount /servercount
ENTRYPOINT ["/servercount"]
