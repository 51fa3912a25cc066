package interop

import (
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

var httpc = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}

// httpGet returns status and body of http://addr/path.
func httpGet(addr, path string) (int, string, error) {
	resp, err := httpc.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// metrics is one parsed /metrics scrape.
type metrics map[string]*dto.MetricFamily

func scrape(addr string) (metrics, error) {
	code, body, err := httpGet(addr, "/metrics")
	if err != nil {
		return nil, err
	}
	if code != 200 {
		return nil, fmt.Errorf("GET %s/metrics: %d", addr, code)
	}
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("%s/metrics is not valid Prometheus text: %w", addr, err)
	}
	return metrics(fams), nil
}

func sampleValue(m *dto.Metric) float64 {
	switch {
	case m.Counter != nil:
		return m.Counter.GetValue()
	case m.Gauge != nil:
		return m.Gauge.GetValue()
	case m.Untyped != nil:
		return m.Untyped.GetValue()
	case m.Histogram != nil:
		return float64(m.Histogram.GetSampleCount())
	case m.Summary != nil:
		return float64(m.Summary.GetSampleCount())
	}
	return 0
}

func labelsOf(m *dto.Metric) map[string]string {
	out := map[string]string{}
	for _, l := range m.Label {
		out[l.GetName()] = l.GetValue()
	}
	return out
}

// labelKey is a stable rendering of a label set: `a="x",b="y"`.
func labelKey(m *dto.Metric) string {
	var parts []string
	for _, l := range m.Label {
		parts = append(parts, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// get is the value of name's series whose labels include want (a histogram
// gives its sample count); absent series count as 0 and ok=false.
func (ms metrics) get(name string, want map[string]string) (float64, bool) {
	f := ms[name]
	if f == nil {
		return 0, false
	}
	sum, found := 0.0, false
	for _, m := range f.Metric {
		l := labelsOf(m)
		match := true
		for k, v := range want {
			if l[k] != v {
				match = false
				break
			}
		}
		if match {
			sum += sampleValue(m)
			found = true
		}
	}
	return sum, found
}

// byLabel is name's values keyed by one label's value.
func (ms metrics) byLabel(name, label string) map[string]float64 {
	out := map[string]float64{}
	if f := ms[name]; f != nil {
		for _, m := range f.Metric {
			out[labelsOf(m)[label]] += sampleValue(m)
		}
	}
	return out
}

// delta is after-before per key, dropping zeros.
func delta(before, after map[string]float64) map[string]float64 {
	out := map[string]float64{}
	for k, v := range after {
		if d := v - before[k]; d != 0 {
			out[k] = d
		}
	}
	for k, v := range before {
		if _, ok := after[k]; !ok && v != 0 {
			out[k] = -v
		}
	}
	return out
}

func sameCounts(a, b map[string]float64) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func fmtCounts(m map[string]float64) string {
	if len(m) == 0 {
		return "{}"
	}
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s:%g", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}

const (
	mServerDialFailures = "konnectivity_network_proxy_server_dial_failure_count"
	mServerPending      = "konnectivity_network_proxy_server_pending_backend_dials"
	mServerEstablished  = "konnectivity_network_proxy_server_established_connections"
	mServerReady        = "konnectivity_network_proxy_server_ready_backends"
	mServerGRPCConns    = "konnectivity_network_proxy_server_grpc_connections"
	mAgentDialFailures  = "konnectivity_network_proxy_agent_endpoint_dial_failure_total"
	mAgentOpenServers   = "konnectivity_network_proxy_agent_open_server_connections"
	mAgentOpenEndpoints = "konnectivity_network_proxy_agent_open_endpoint_connections"
	mAgentDialDuration  = "konnectivity_network_proxy_agent_dial_duration_seconds"
)
