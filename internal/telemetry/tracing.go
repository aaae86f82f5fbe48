package telemetry

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// OTLP protocols (OTEL_EXPORTER_OTLP_PROTOCOL).
const (
	ProtocolGRPC         = "grpc"
	ProtocolHTTPProtobuf = "http/protobuf"
)

// TracingOptions configure [NewTracing]. With neither Endpoint nor
// Exporter, tracing is off.
type TracingOptions struct {
	// Endpoint is the OTLP collector's URL, e.g. http://otel-collector:4317
	// (gRPC) or http://otel-collector:4318 (HTTP, whose spans go to the
	// path plus /v1/traces, as with OTEL_EXPORTER_OTLP_ENDPOINT); an http
	// URL sends without TLS. The exporter reads the other standard OTEL_EXPORTER_OTLP_*
	// variables (headers, certificates, timeout) itself.
	Endpoint string
	// Protocol is ProtocolGRPC or ProtocolHTTPProtobuf (the default, as
	// in the OpenTelemetry specification).
	Protocol string
	// ServiceName is the resource's service.name unless OTEL_SERVICE_NAME
	// or OTEL_RESOURCE_ATTRIBUTES sets it. Default "countersign".
	ServiceName string
	// Exporter replaces the OTLP exporter (tests: tracetest.InMemoryExporter).
	// Spans go to it synchronously.
	Exporter sdktrace.SpanExporter
}

// Tracing is the process's tracer provider and propagator. A nil *Tracing
// is off.
type Tracing struct {
	provider *sdktrace.TracerProvider
}

// Propagator is the W3C trace context and baggage: what Countersign reads
// from and writes to HTTP headers and Temporal headers.
var Propagator propagation.TextMapPropagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})

// NewTracing builds the tracer provider; nil (off) without an endpoint or
// an exporter. The sampler follows OTEL_TRACES_SAMPLER (default:
// parent-based, always on).
func NewTracing(ctx context.Context, o TracingOptions) (*Tracing, error) {
	exp := o.Exporter
	var batch bool
	if exp == nil {
		if o.Endpoint == "" {
			return nil, nil
		}
		u, err := url.Parse(o.Endpoint)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return nil, fmt.Errorf("telemetry: OTLP endpoint %q must be an http(s) URL such as http://otel-collector:4318", o.Endpoint)
		}
		switch o.Protocol {
		case ProtocolGRPC:
			exp, err = otlptracegrpc.New(ctx, otlptracegrpc.WithEndpointURL(o.Endpoint))
		case ProtocolHTTPProtobuf, "":
			exp, err = otlptracehttp.New(ctx, otlptracehttp.WithEndpointURL(tracesURL(u)))
		default:
			return nil, fmt.Errorf("telemetry: OTLP protocol %q: use %s or %s", o.Protocol, ProtocolGRPC, ProtocolHTTPProtobuf)
		}
		if err != nil {
			return nil, fmt.Errorf("telemetry: OTLP exporter: %w", err)
		}
		batch = true
	}
	name := o.ServiceName
	if name == "" {
		name = "countersign"
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", name)),
		resource.WithFromEnv(), // OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES win
		resource.WithTelemetrySDK(),
	)
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	opts := []sdktrace.TracerProviderOption{sdktrace.WithResource(res)}
	if batch {
		opts = append(opts, sdktrace.WithBatcher(exp))
	} else {
		opts = append(opts, sdktrace.WithSyncer(exp))
	}
	return &Tracing{provider: sdktrace.NewTracerProvider(opts...)}, nil
}

// tracesPath is where an OTLP/HTTP collector takes traces.
const tracesPath = "/v1/traces"

// tracesURL is the URL OTLP/HTTP trace exports go to. The endpoint is a base
// URL, as OTEL_EXPORTER_OTLP_ENDPOINT is: the exporter's own option would
// post to its path as it is ("/" for http://collector:4318), where a
// collector answers 404, so /v1/traces is appended to the path, unless the
// path already ends with it.
func tracesURL(endpoint *url.URL) string {
	u := *endpoint
	if !strings.HasSuffix(u.Path, tracesPath) {
		u.Path = strings.TrimSuffix(u.Path, "/") + tracesPath
		u.RawPath = ""
	}
	return u.String()
}

// On reports whether spans are recorded and exported.
func (t *Tracing) On() bool { return t != nil && t.provider != nil }

// Provider is the tracer provider (only when On).
func (t *Tracing) Provider() trace.TracerProvider { return t.provider }

// Shutdown flushes and stops the exporter; a no-op when off.
func (t *Tracing) Shutdown(ctx context.Context) error {
	if !t.On() {
		return nil
	}
	return t.provider.Shutdown(ctx)
}
