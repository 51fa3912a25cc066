// Command otlpcollector is the OpenTelemetry collector's own OTLP receiver
// (go.opentelemetry.io/collector/receiver/otlpreceiver, its OTLP/HTTP
// protocol only) with a consumer that prints one JSON line per span on
// stdout, in the same form as tests/otlpreceiver. The Rust tests send
// proxy-server's and proxy-agent's spans to both. It listens on
// 127.0.0.1 and prints "listening <addr>" once the receiver has started.
package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"syscall"

	"go.opentelemetry.io/collector/component"
	"go.opentelemetry.io/collector/component/componenttest"
	"go.opentelemetry.io/collector/config/configgrpc"
	"go.opentelemetry.io/collector/config/configoptional"
	"go.opentelemetry.io/collector/consumer"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/ptrace"
	"go.opentelemetry.io/collector/receiver"
	"go.opentelemetry.io/collector/receiver/otlpreceiver"
	"go.uber.org/zap"
)

type line struct {
	Service    string            `json:"service"`
	TraceID    string            `json:"trace_id"`
	SpanID     string            `json:"span_id"`
	Parent     string            `json:"parent_span_id"`
	Name       string            `json:"name"`
	Kind       string            `json:"kind"`
	Start      uint64            `json:"start_unix_nano"`
	End        uint64            `json:"end_unix_nano"`
	Status     string            `json:"status"`
	Attributes map[string]string `json:"attributes"`
}

// The generated protobuf enum names, as tests/otlpreceiver prints them.
var kinds = map[ptrace.SpanKind]string{
	ptrace.SpanKindUnspecified: "SPAN_KIND_UNSPECIFIED",
	ptrace.SpanKindInternal:    "SPAN_KIND_INTERNAL",
	ptrace.SpanKindServer:      "SPAN_KIND_SERVER",
	ptrace.SpanKindClient:      "SPAN_KIND_CLIENT",
	ptrace.SpanKindProducer:    "SPAN_KIND_PRODUCER",
	ptrace.SpanKindConsumer:    "SPAN_KIND_CONSUMER",
}

var codes = map[ptrace.StatusCode]string{
	ptrace.StatusCodeUnset: "STATUS_CODE_UNSET",
	ptrace.StatusCodeOk:    "STATUS_CODE_OK",
	ptrace.StatusCodeError: "STATUS_CODE_ERROR",
}

func id(b []byte, empty bool) string {
	if empty {
		return ""
	}
	return hex.EncodeToString(b)
}

func print(out *json.Encoder) func(context.Context, ptrace.Traces) error {
	return func(_ context.Context, td ptrace.Traces) error {
		for _, rs := range td.ResourceSpans().All() {
			service := ""
			if v, ok := rs.Resource().Attributes().Get("service.name"); ok {
				service = v.AsString()
			}
			for _, ss := range rs.ScopeSpans().All() {
				for _, s := range ss.Spans().All() {
					attrs := map[string]string{}
					s.Attributes().Range(func(k string, v pcommon.Value) bool {
						attrs[k] = v.AsString()
						return true
					})
					tid, sid, pid := s.TraceID(), s.SpanID(), s.ParentSpanID()
					_ = out.Encode(line{
						Service:    service,
						TraceID:    id(tid[:], tid.IsEmpty()),
						SpanID:     id(sid[:], sid.IsEmpty()),
						Parent:     id(pid[:], pid.IsEmpty()),
						Name:       s.Name(),
						Kind:       kinds[s.Kind()],
						Start:      uint64(s.StartTimestamp()),
						End:        uint64(s.EndTimestamp()),
						Status:     codes[s.Status().Code()],
						Attributes: attrs,
					})
				}
			}
		}
		return nil
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, err)
	os.Exit(1)
}

func main() {
	ctx := context.Background()
	sink, err := consumer.NewTraces(print(json.NewEncoder(os.Stdout)))
	if err != nil {
		fail(err)
	}
	f := otlpreceiver.NewFactory()
	set := receiver.Settings{
		ID:                component.NewID(f.Type()),
		TelemetrySettings: componenttest.NewNopTelemetrySettings(),
	}
	set.Logger = zap.NewNop()
	// The receiver binds the address it is given and does not say which
	// port it got for :0, so a port is picked and the start retried if
	// another process took it meanwhile (Start fails on the bind).
	for attempt := 0; ; attempt++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fail(err)
		}
		addr := l.Addr().String()
		l.Close()
		cfg := f.CreateDefaultConfig().(*otlpreceiver.Config)
		cfg.Protocols.GRPC = configoptional.None[configgrpc.ServerConfig]()
		cfg.Protocols.HTTP.GetOrInsertDefault().ServerConfig.NetAddr.Endpoint = addr
		r, err := f.CreateTraces(ctx, set, cfg, sink)
		if err != nil {
			fail(err)
		}
		if err := r.Start(ctx, componenttest.NewNopHost()); err != nil {
			if attempt < 10 {
				continue
			}
			fail(err)
		}
		fmt.Printf("listening %s\n", addr)
		sigs := make(chan os.Signal, 1)
		signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
		<-sigs
		_ = r.Shutdown(ctx)
		return
	}
}
