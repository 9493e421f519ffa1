// Package tracectx carries W3C trace context in gRPC metadata, once per
// stream: the head injects it when it opens a Session, the worker extracts it
// to parent the stream's span. Nothing is done per message.
package tracectx

import (
	"context"

	"go.opentelemetry.io/otel/propagation"
	"google.golang.org/grpc/metadata"
)

// carrier adapts gRPC metadata to a TextMapCarrier.
type carrier metadata.MD

func (c carrier) Get(key string) string {
	if v := metadata.MD(c).Get(key); len(v) > 0 {
		return v[0]
	}
	return ""
}

func (c carrier) Set(key, value string) { metadata.MD(c).Set(key, value) }

func (c carrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

var prop = propagation.TraceContext{}

// Inject adds ctx's span context to the outgoing metadata.
func Inject(ctx context.Context) context.Context {
	md, ok := metadata.FromOutgoingContext(ctx)
	if ok {
		md = md.Copy()
	} else {
		md = metadata.MD{}
	}
	prop.Inject(ctx, carrier(md))
	return metadata.NewOutgoingContext(ctx, md)
}

// Extract returns ctx carrying the remote span context from the incoming
// metadata, if any.
func Extract(ctx context.Context) context.Context {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ctx
	}
	return prop.Extract(ctx, carrier(md))
}
