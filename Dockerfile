# syntax=docker/dockerfile:1

# sbclaim container images.
#
# One builder stage compiles every binary under ./cmd once; each final stage
# copies a single binary into distroless/static (CA certificates, tzdata,
# /etc/passwd with the nonroot user, no shell, no package manager) and makes
# it the ENTRYPOINT, so an image does one thing and `docker run IMAGE ARGS`
# passes ARGS straight to that binary:
#
#   docker build --target processor  -t sbclaim/processor  .
#   docker build --target reconciler -t sbclaim/reconciler .
#   docker build --target demoapi    -t sbclaim/demoapi    .
#   docker build --target demosender -t sbclaim/demosender .
#
# Separate targets rather than one image with a TARGET build-arg: a
# build-arg cannot choose the ENTRYPOINT without a shell wrapper (distroless
# has no shell), the production images (processor, reconciler) do not carry
# the demo binaries, and BuildKit builds the shared builder stage only once
# whichever targets are requested.
#
# There is deliberately no HEALTHCHECK: Azure Container Apps ignores it and
# probes the HTTP endpoints instead (GET /healthz for liveness, GET /readyz
# for readiness, on SBCLAIM_HTTP_ADDR), and distroless has no curl to run one.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS builder
ARG TARGETOS
ARG TARGETARCH
WORKDIR /src
# Dependencies first, so editing the source does not invalidate them.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=bind,source=go.mod,target=go.mod \
    --mount=type=bind,source=go.sum,target=go.sum \
    go mod download -x
# Keep these flags identical to .ci/validate-deploy.sh, which checks that the
# binaries build the way the image builds them.
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    --mount=type=bind,target=. \
    mkdir -p /out && \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/...

FROM gcr.io/distroless/static-debian12:nonroot AS base
# The nonroot tag already runs as uid/gid 65532; stated again so that an
# accidental base-image change cannot silently run the binaries as root.
USER 65532:65532

FROM base AS demoapi
COPY --from=builder /out/demoapi /usr/local/bin/demoapi
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/demoapi"]

FROM base AS demosender
COPY --from=builder /out/demosender /usr/local/bin/demosender
ENTRYPOINT ["/usr/local/bin/demosender"]

FROM base AS reconciler
COPY --from=builder /out/reconciler /usr/local/bin/reconciler
EXPOSE 8081
ENTRYPOINT ["/usr/local/bin/reconciler"]
CMD ["run"]

# The processor is the last stage, so a plain `docker build .` produces it.
FROM base AS processor
COPY --from=builder /out/processor /usr/local/bin/processor
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/processor"]
