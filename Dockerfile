# Tidemark's Airbyte source connector (and the tidemark CLI), as the Airbyte platform runs it:
# a static binary, a shell (the platform runs `sh -c 'eval "$AIRBYTE_ENTRYPOINT read ..."'`),
# AIRBYTE_ENTRYPOINT equal to the entrypoint, the io.airbyte labels, a non-root user.
#
#   docker build -t tidemark/source-postgres:0.1.0 --build-arg VERSION=0.1.0 .
#   docker run --rm tidemark/source-postgres:0.1.0 spec
#
# The runtime's base is the build argument BASE: any image with /bin/sh will do, since nothing is
# installed into it (the binaries are static and embed the time zone database; alpine brings the
# CA certificates for TLS without a CA given). Both images pulled are named by tag and pinned by
# the digest of their index, so that a moved tag cannot change what is built; docs/airbyte.md says
# how to move them to a newer release (TestDockerfileBasesPinned fails once the runtime's alpine
# is out of support). The target `prebuilt` takes binaries built outside
# the image from bin/ in the build context instead of compiling them, so an image can be made with
# no registry at all (the image test does so, on a busybox base; see docs/airbyte.md):
#
#   CGO_ENABLED=0 go build -trimpath -tags timetzdata -ldflags "-s -w" -o ctx/bin/source-postgres ./cmd/source-postgres
#   CGO_ENABLED=0 go build -trimpath -tags timetzdata -ldflags "-s -w" -o ctx/bin/tidemark ./cmd/tidemark
#   docker build --target prebuilt --build-arg BASE=my/base-with-sh -f Dockerfile -t my/source-postgres ctx
#
# The stages are in this order so that a builder that runs every stage up to the target (the
# classic builder) does not need the Go image for `prebuilt`.

# alpine 3.24.2 (supported until 2028-05-01)
ARG BASE=alpine:3.24.2@sha256:31b6477333eb8257db9e5d7c3a7264fd0467928756f0bbcc27d35bea5d28cdbd
# Go 1.26.8 on alpine 3.24
ARG GOLANG=golang:1.26-alpine3.24@sha256:ce864e7223ac17b1775e6fd0b4c0db580c2eb50e7953a427916379e4b92a1628
ARG VERSION=0.1.0

# The runtime without binaries.
FROM ${BASE} AS runtime
ARG VERSION
ENV AIRBYTE_ENTRYPOINT="/usr/local/bin/source-postgres"
ENTRYPOINT ["/usr/local/bin/source-postgres"]
LABEL io.airbyte.name="tidemark/source-postgres" \
      io.airbyte.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/tidemark/tidemark" \
      org.opencontainers.image.description="Tidemark: PostgreSQL CDC source for Airbyte that backfills while it streams"
# The platform runs connectors as uid/gid 1000 with a read-only root filesystem: nothing is
# written anywhere (inline certificates and keys are kept in memory).
USER 1000:1000

# The runtime with binaries built outside the image (bin/ of the build context).
FROM runtime AS prebuilt
COPY bin/source-postgres bin/tidemark /usr/local/bin/

FROM ${GOLANG} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION
RUN CGO_ENABLED=0 go build -trimpath -tags timetzdata -ldflags "-s -w -X main.version=${VERSION}" -o /out/source-postgres ./cmd/source-postgres \
 && CGO_ENABLED=0 go build -trimpath -tags timetzdata -ldflags "-s -w" -o /out/tidemark ./cmd/tidemark

# The image (the default target): the runtime with the binaries built above.
FROM runtime AS image
COPY --from=build /out/source-postgres /out/tidemark /usr/local/bin/
