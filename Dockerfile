# Countersign: one static binary; `server` and `worker` are its production roles.
FROM golang:1.26.8-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags="-s -w" -o /out/countersign ./cmd/countersign

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/countersign /usr/local/bin/countersign
USER nonroot
ENTRYPOINT ["/usr/local/bin/countersign"]
