# Countersign: one static binary; `server` and `worker` are its production roles.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags="-s -w" -o /out/countersign ./cmd/countersign
# The data directory, owned by the image's user, so a volume mounted there
# starts writable by it (docker-compose.yml mounts one for the audit keys).
RUN mkdir -p /out/data

# No shell and no HTTP client in this image: probes run
# `countersign healthcheck URL` (see docker-compose.yml).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/countersign /usr/local/bin/countersign
COPY --from=build --chown=65532:65532 /out/data /var/lib/countersign
ENV COUNTERSIGN_DATA_DIR=/var/lib/countersign
USER nonroot
ENTRYPOINT ["/usr/local/bin/countersign"]
