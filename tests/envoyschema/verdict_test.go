package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	bootstrapv3 "github.com/envoyproxy/go-control-plane/envoy/config/bootstrap/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"
	"sigs.k8s.io/yaml"

	// Types the corpus packs into an Any besides the roots': Envoy links
	// them, so its parser resolves them; so must this one.
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/access_loggers/stream/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/listener/tls_inspector/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/resource_monitors/fixed_heap/v3"
	_ "github.com/envoyproxy/go-control-plane/envoy/extensions/transport_sockets/tls/v3"
	_ "google.golang.org/protobuf/types/known/emptypb"
)

// envoyMaxSeconds is Envoy's bound on every duration in its configuration
// (validateDurationUnifiedNoThrow: (INT64_MAX - 999,999,999) ns).
const envoyMaxSeconds = 9_223_372_035

// validateDeep applies what Envoy applies after parsing: PGV on the message
// and, since PGV stops at an Any, on every message packed in one (Envoy's
// recursivePgvCheck), and its bound on every duration.
func validateDeep(m protoreflect.Message) error {
	if v, ok := m.Interface().(interface{ ValidateAll() error }); ok {
		if err := v.ValidateAll(); err != nil {
			return err
		}
	}
	var err error
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		check := func(mv protoreflect.Message) bool {
			err = checkMessage(mv)
			return err == nil
		}
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(_ protoreflect.MapKey, mv protoreflect.Value) bool {
					return check(mv.Message())
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				l := v.List()
				for i := 0; i < l.Len() && err == nil; i++ {
					check(l.Get(i).Message())
				}
			}
		case fd.Message() != nil:
			check(v.Message())
		}
		return err == nil
	})
	return err
}

func checkMessage(m protoreflect.Message) error {
	switch msg := m.Interface().(type) {
	case *durationpb.Duration:
		if msg.GetSeconds() < 0 || msg.GetNanos() < 0 {
			return fmt.Errorf("negative duration %v", msg)
		}
		if msg.GetSeconds() > envoyMaxSeconds {
			return fmt.Errorf("duration %v past Envoy's bound", msg)
		}
		return nil
	case *anypb.Any:
		inner, err := msg.UnmarshalNew()
		if err != nil {
			return err
		}
		return validateDeep(inner.ProtoReflect())
	}
	return validateDeep(m)
}

// envoyVerdict is what Envoy's own parsing and validation (as
// go-control-plane carries them) make of a bootstrap: nil when it takes it.
func envoyVerdict(text []byte) error {
	j, err := yaml.YAMLToJSON(text)
	if err != nil {
		return fmt.Errorf("yaml: %w", err)
	}
	var b bootstrapv3.Bootstrap
	if err := (protojson.UnmarshalOptions{Resolver: protoregistry.GlobalTypes}).Unmarshal(j, &b); err != nil {
		return fmt.Errorf("protojson: %w", err)
	}
	return validateDeep(b.ProtoReflect())
}

func agentBinary(t *testing.T) string {
	bin := os.Getenv("TUNNEL_AGENT_BIN")
	if bin == "" {
		bin = filepath.Join(repoRoot(), "target", "debug", "tunnel-agent")
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("tunnel-agent binary %s: %v (cargo build -p tunnel-agent, or set TUNNEL_AGENT_BIN)", bin, err)
	}
	return bin
}

// agentVerdict runs `tunnel-agent --mode validate -c <file>`: nil when it
// accepts the file, else its error.
func agentVerdict(bin, file string) error {
	cmd := exec.Command(bin, "--mode", "validate", "-c", file)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.Env = append(os.Environ(), "RUST_LOG=error")
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &exit):
		return errors.New(strings.TrimSpace(out.String()))
	default:
		return fmt.Errorf("running %s: %w", bin, err)
	}
}

// Refusals of a bootstrap Envoy takes that the agent makes on purpose:
// fields it cannot honour safely (bootstrap.rs POLICY) and shapes it does
// not serve (one filter chain, one endpoint, TCP, HTTP/2 to the seed, …).
// Each is in docs/nodeport-proxy.md.
var ownRefusals = []string{
	"cannot be honoured safely",
	"deprecated, and disallowed by default in Envoy",
	"only TCP is supported",
	"exactly one filter chain",
	"exactly one filter is supported",
	"exactly one endpoint",
	"only the router filter",
	"only prefix matches",
	"only routes to a cluster",
	"LOGICAL_DNS, STRICT_DNS or STATIC expected",
	"port_value 0",
	"port_value is 0",
	"only tcp_proxy (tunneling)",
	"only the domain",
	"idle_timeout differs",
	"is not an IP address",
	"HTTP/1.1 CONNECT is not supported",
	"a socket_address is required",
	"the endpoint has no address",
	"no tunneling listener",
	"collides with the stats port",
	"every listener must tunnel through one cluster",
	"only routes to the admin address",
	"a second stats listener",
	"listener port",
}

func ownRefusal(err error) bool {
	for _, s := range ownRefusals {
		if strings.Contains(err.Error(), s) {
			return true
		}
	}
	return false
}

type verdicts struct {
	mu                                      sync.Mutex
	bothAccept, bothRefuse, agentOnly, fail int
	reasons                                 map[string]int
	failures                                []string
}

func (v *verdicts) record(name string, envoy, agent error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	switch {
	case envoy == nil && agent == nil:
		v.bothAccept++
	case envoy != nil && agent != nil:
		v.bothRefuse++
	case envoy != nil:
		v.fail++
		v.failures = append(v.failures, fmt.Sprintf("%s: Envoy refuses (%v), tunnel-agent accepts", name, envoy))
	case ownRefusal(agent):
		v.agentOnly++
		for _, s := range ownRefusals {
			if strings.Contains(agent.Error(), s) {
				v.reasons[s]++
				break
			}
		}
	default:
		v.fail++
		v.failures = append(v.failures, fmt.Sprintf("%s: Envoy accepts, tunnel-agent refuses: %v", name, agent))
	}
}

// sample is a value of the field's type that protobuf's JSON parser takes.
func sample(fd protoreflect.FieldDescriptor) any {
	one := func(fd protoreflect.FieldDescriptor) any {
		switch fd.Kind() {
		case protoreflect.BoolKind:
			return true
		case protoreflect.StringKind:
			return "x"
		case protoreflect.BytesKind:
			return "eA=="
		case protoreflect.EnumKind:
			vs := fd.Enum().Values()
			if vs.Len() > 1 {
				return string(vs.Get(1).Name())
			}
			return string(vs.Get(0).Name())
		case protoreflect.FloatKind, protoreflect.DoubleKind:
			return 1.5
		case protoreflect.MessageKind, protoreflect.GroupKind:
			switch fd.Message().FullName() {
			case "google.protobuf.Duration":
				return "1s"
			case "google.protobuf.Timestamp":
				return "2026-01-01T00:00:00Z"
			case "google.protobuf.FieldMask":
				return "a"
			case "google.protobuf.Value":
				return 1
			case "google.protobuf.ListValue":
				return []any{}
			case "google.protobuf.BoolValue":
				return true
			case "google.protobuf.StringValue", "google.protobuf.BytesValue":
				return "eA=="
			case "google.protobuf.UInt32Value", "google.protobuf.UInt64Value",
				"google.protobuf.Int32Value", "google.protobuf.Int64Value":
				return 1
			case "google.protobuf.DoubleValue", "google.protobuf.FloatValue":
				return 1.5
			case "google.protobuf.Any":
				return map[string]any{"@type": "type.googleapis.com/google.protobuf.Empty", "value": map[string]any{}}
			}
			return map[string]any{}
		default:
			return 1
		}
	}
	switch {
	case fd.IsMap():
		return map[string]any{"1": one(fd.MapValue())}
	case fd.IsList():
		return []any{one(fd)}
	}
	return one(fd)
}

// instance is a message in a parsed document: its JSON object, descriptor
// and place.
type instance struct {
	obj  map[string]any
	md   protoreflect.MessageDescriptor
	path string
}

// instances walks a document as message md, listing every message in it.
func instances(obj map[string]any, md protoreflect.MessageDescriptor, path string, out *[]instance) {
	if t, ok := obj["@type"].(string); ok && md.FullName() == "google.protobuf.Any" {
		mt, err := protoregistry.GlobalTypes.FindMessageByURL(t)
		if err != nil {
			return
		}
		md = mt.Descriptor()
	}
	*out = append(*out, instance{obj, md, path})
	for key, v := range obj {
		fd := md.Fields().ByName(protoreflect.Name(key))
		if fd == nil {
			fd = md.Fields().ByJSONName(key)
		}
		if fd == nil {
			continue
		}
		vd := fd
		if fd.IsMap() {
			vd = fd.MapValue()
		}
		if vd.Message() == nil {
			continue
		}
		at := path + "." + key
		switch x := v.(type) {
		case map[string]any:
			if fd.IsMap() {
				for k, e := range x {
					if m, ok := e.(map[string]any); ok {
						instances(m, vd.Message(), at+"["+k+"]", out)
					}
				}
			} else {
				instances(x, vd.Message(), at, out)
			}
		case []any:
			for i, e := range x {
				if m, ok := e.(map[string]any); ok {
					instances(m, vd.Message(), fmt.Sprintf("%s[%d]", at, i), out)
				}
			}
		}
	}
}

func specialJSON(md protoreflect.MessageDescriptor) bool {
	return strings.HasPrefix(string(md.FullName()), "google.protobuf.")
}

// TestEveryFieldOnKKPsPathAgreesWithEnvoy sets, one at a time, every field
// of every message in KKP's rendered envoy-agent bootstrap that it leaves
// unset, and holds tunnel-agent's verdict against Envoy's (go-control-plane's
// protojson parsing and PGV validation, recursing into Any as Envoy does,
// and Envoy's duration bound): whatever Envoy refuses, the agent refuses;
// whatever Envoy takes, the agent takes, unless it is a documented refusal
// of its own.
func TestEveryFieldOnKKPsPathAgreesWithEnvoy(t *testing.T) {
	bin := agentBinary(t)
	base, err := os.ReadFile(filepath.Join(repoRoot(), "tunnel-agent", "testdata", "kkp-envoy-agent-openvpn.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := envoyVerdict(base); err != nil {
		t.Fatalf("Envoy refuses KKP's own bootstrap: %v", err)
	}
	if err := agentVerdict(bin, filepath.Join(repoRoot(), "tunnel-agent", "testdata", "kkp-envoy-agent-openvpn.yaml")); err != nil {
		t.Fatalf("tunnel-agent refuses KKP's own bootstrap: %v", err)
	}
	j, err := yaml.YAMLToJSON(base)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(j, &doc); err != nil {
		t.Fatal(err)
	}
	var insts []instance
	instances(doc, (&bootstrapv3.Bootstrap{}).ProtoReflect().Descriptor(), "", &insts)
	type testCase struct {
		name string
		text []byte
	}
	var cases []testCase
	for _, in := range insts {
		if specialJSON(in.md) {
			continue
		}
		for i := 0; i < in.md.Fields().Len(); i++ {
			fd := in.md.Fields().Get(i)
			if _, set := in.obj[string(fd.Name())]; set {
				continue
			}
			if _, set := in.obj[fd.JSONName()]; set {
				continue
			}
			in.obj[string(fd.Name())] = sample(fd)
			text, err := json.Marshal(doc)
			delete(in.obj, string(fd.Name()))
			if err != nil {
				t.Fatal(err)
			}
			cases = append(cases, testCase{strings.TrimPrefix(in.path+"."+string(fd.Name()), "."), text})
		}
	}
	if len(cases) < 500 {
		t.Fatalf("only %d cases: the walk lost its way", len(cases))
	}
	dir := t.TempDir()
	v := &verdicts{reasons: map[string]int{}}
	work := make(chan int)
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range work {
				c := cases[i]
				file := filepath.Join(dir, fmt.Sprintf("case-%d.yaml", i))
				if err := os.WriteFile(file, c.text, 0o644); err != nil {
					t.Error(err)
					continue
				}
				v.record(c.name, envoyVerdict(c.text), agentVerdict(bin, file))
				_ = os.Remove(file)
			}
		}()
	}
	for i := range cases {
		work <- i
	}
	close(work)
	wg.Wait()
	var reasons []string
	for r, n := range v.reasons {
		reasons = append(reasons, fmt.Sprintf("%q: %d", r, n))
	}
	sort.Strings(reasons)
	t.Logf("%d cases in %v: both accept %d, both refuse %d, only tunnel-agent refuses (its own, documented) %d: %s",
		len(cases), time.Since(start).Round(time.Millisecond), v.bothAccept, v.bothRefuse, v.agentOnly, strings.Join(reasons, ", "))
	sort.Strings(v.failures)
	for _, f := range v.failures {
		t.Error(f)
	}
}

// TestFuzzCorpusVerdicts holds the agent's verdicts on its committed fuzz
// corpus against Envoy's: nothing Envoy refuses is taken, and KKP's renders
// (ok-*) are taken by both.
func TestFuzzCorpusVerdicts(t *testing.T) {
	bin := agentBinary(t)
	dir := filepath.Join(repoRoot(), "tunnel-agent", "fuzz", "corpus", "bootstrap")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	v := &verdicts{reasons: map[string]int{}}
	for _, e := range entries {
		file := filepath.Join(dir, e.Name())
		text, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		envoy, agent := envoyVerdict(text), agentVerdict(bin, file)
		if strings.HasPrefix(e.Name(), "ok-") && (envoy != nil || agent != nil) {
			t.Errorf("%s: a KKP render must be taken: Envoy: %v; tunnel-agent: %v", e.Name(), envoy, agent)
		}
		v.record(e.Name(), envoy, agent)
	}
	t.Logf("%d files: both accept %d, both refuse %d, only tunnel-agent refuses (its own) %d",
		len(entries), v.bothAccept, v.bothRefuse, v.agentOnly)
	for _, f := range v.failures {
		t.Error(f)
	}
}
