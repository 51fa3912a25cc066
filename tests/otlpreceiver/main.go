// Command otlpreceiver is the OTLP/HTTP trace receiver the Rust tests send
// proxy-server's spans to: it decodes each export request with the
// protocol's generated Go types (go.opentelemetry.io/proto/otlp), as a
// collector's receiver does, and prints one JSON line per span on stdout.
// It binds 127.0.0.1:0 and prints "listening <addr>" first.
package main

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	commonpb "go.opentelemetry.io/proto/otlp/common/v1"
	"google.golang.org/protobuf/proto"
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

func value(v *commonpb.AnyValue) string {
	switch x := v.GetValue().(type) {
	case *commonpb.AnyValue_StringValue:
		return x.StringValue
	case *commonpb.AnyValue_IntValue:
		return fmt.Sprint(x.IntValue)
	default:
		return fmt.Sprint(v)
	}
}

func main() {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("listening %s\n", l.Addr())
	out := json.NewEncoder(os.Stdout)
	http.HandleFunc("/v1/traces", func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "want POST application/x-protobuf", http.StatusUnsupportedMediaType)
			return
		}
		body, err := io.ReadAll(io.LimitReader(r.Body, 16<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		var req coltracepb.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		for _, rs := range req.GetResourceSpans() {
			service := ""
			for _, a := range rs.GetResource().GetAttributes() {
				if a.GetKey() == "service.name" {
					service = value(a.GetValue())
				}
			}
			for _, ss := range rs.GetScopeSpans() {
				for _, s := range ss.GetSpans() {
					attrs := map[string]string{}
					for _, a := range s.GetAttributes() {
						attrs[a.GetKey()] = value(a.GetValue())
					}
					_ = out.Encode(line{
						Service:    service,
						TraceID:    hex.EncodeToString(s.GetTraceId()),
						SpanID:     hex.EncodeToString(s.GetSpanId()),
						Parent:     hex.EncodeToString(s.GetParentSpanId()),
						Name:       s.GetName(),
						Kind:       s.GetKind().String(),
						Start:      s.GetStartTimeUnixNano(),
						End:        s.GetEndTimeUnixNano(),
						Status:     s.GetStatus().GetCode().String(),
						Attributes: attrs,
					})
				}
			}
		}
		w.Header().Set("Content-Type", "application/x-protobuf")
		resp, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
		_, _ = w.Write(resp)
	})
	if err := http.Serve(l, nil); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
