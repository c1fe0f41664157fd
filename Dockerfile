# Tidemark's Airbyte source connector (and the tidemark CLI), as the Airbyte platform runs it:
# a static binary, a shell (the platform runs `sh -c 'eval "$AIRBYTE_ENTRYPOINT read ..."'`),
# AIRBYTE_ENTRYPOINT equal to the entrypoint, the io.airbyte labels, a non-root user.
#
#   docker build -t tidemark/source-postgres:0.1.0 --build-arg VERSION=0.1.0 .
#   docker run --rm tidemark/source-postgres:0.1.0 spec

FROM golang:1.26-alpine AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG VERSION=0.1.0
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/source-postgres ./cmd/source-postgres \
 && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/tidemark ./cmd/tidemark

FROM alpine:3.20
ARG VERSION=0.1.0
RUN apk add --no-cache ca-certificates tzdata
COPY --from=build /out/source-postgres /out/tidemark /usr/local/bin/
ENV AIRBYTE_ENTRYPOINT="/usr/local/bin/source-postgres"
ENTRYPOINT ["/usr/local/bin/source-postgres"]
LABEL io.airbyte.name="tidemark/source-postgres" \
      io.airbyte.version="${VERSION}" \
      org.opencontainers.image.source="https://github.com/tidemark/tidemark" \
      org.opencontainers.image.description="Tidemark: PostgreSQL CDC source for Airbyte that backfills while it streams"
# The platform runs connectors as uid/gid 1000 with a read-only root filesystem: nothing is
# written outside TMPDIR (certificates given inline go to a private directory there).
USER 1000:1000
