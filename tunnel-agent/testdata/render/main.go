// Command render writes envoy-agent's ConfigMap data (key envoy.yaml) exactly
// as KKP renders it: it takes the template out of KKP's own
// pkg/controller/user-cluster-controller-manager/resources/resources/envoy-agent/configmap.go
// (parsed with go/ast, not copied) and executes it with text/template on
// the values user-cluster-controller-manager's reconcileConfigMaps passes
// (AdminPort 9902, ProxyPort 8088, StatsPort 8002 set by
// ConfigMapReconciler), here with loopback addresses.
//
//	go run ./tunnel-agent/testdata/render -configmap-go <KKP>/…/envoy-agent/configmap.go \
//	    -agent-ip 127.0.0.1 -proxy-host localhost -namespace cluster-abc [-openvpn-port 1194]
//
// The fixtures next to this directory were rendered from KKP commit
// 2974df5bdca45628892f10608ca94b866c0c2731 (see ../README.md).
package main

import (
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"net"
	"os"
	"strconv"
	"strings"
	"text/template"
)

// Config and Listener mirror envoyagent.Config and envoyagent.Listener field
// for field: the template reads these names.
type Config struct {
	StatsPort uint32
	AdminPort uint32
	ProxyHost string
	ProxyPort uint32
	Listeners []Listener
}

type Listener struct {
	BindAddress string
	BindPort    uint32
	Authority   string
}

// statsPort is envoyagent.StatsPort.
const statsPort = 8002

func templateFrom(path string) (string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		return "", err
	}
	for _, d := range f.Decls {
		g, ok := d.(*ast.GenDecl)
		if !ok {
			continue
		}
		for _, s := range g.Specs {
			v, ok := s.(*ast.ValueSpec)
			if !ok {
				continue
			}
			for i, n := range v.Names {
				if n.Name != "envoyConfigTemplate" || i >= len(v.Values) {
					continue
				}
				lit, ok := v.Values[i].(*ast.BasicLit)
				if !ok || lit.Kind != token.STRING {
					return "", fmt.Errorf("envoyConfigTemplate is not a string literal")
				}
				return strconv.Unquote(lit.Value)
			}
		}
	}
	return "", fmt.Errorf("%s: no envoyConfigTemplate", path)
}

func main() {
	src := flag.String("configmap-go", "", "KKP's envoy-agent/configmap.go")
	agentIP := flag.String("agent-ip", "100.64.30.10", "tunneling agent IP (-tunneling-agent-ip)")
	kasPort := flag.Uint("kas-secure-port", 6443, "kube-apiserver secure port (-kas-secure-port)")
	proxyHost := flag.String("proxy-host", "", "the cluster URL's host name")
	namespace := flag.String("namespace", "", "the cluster's namespace in the seed (cluster-<id>)")
	openvpnPort := flag.Uint("openvpn-port", 0, "with Konnectivity disabled: the OpenVPN server port")
	flag.Parse()
	text, err := templateFrom(*src)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	// As reconcileConfigMaps builds it.
	cfg := Config{
		AdminPort: 9902,
		ProxyHost: *proxyHost,
		ProxyPort: 8088,
		Listeners: []Listener{{
			BindAddress: *agentIP,
			BindPort:    uint32(*kasPort),
			Authority:   net.JoinHostPort(fmt.Sprintf("apiserver-external.%s.svc.cluster.local", *namespace), "443"),
		}},
	}
	if *openvpnPort != 0 {
		cfg.Listeners = append(cfg.Listeners, Listener{
			BindAddress: *agentIP,
			BindPort:    uint32(*openvpnPort),
			Authority:   net.JoinHostPort(fmt.Sprintf("openvpn-server.%s.svc.cluster.local", *namespace), "1194"),
		})
	}
	// As ConfigMapReconciler does.
	for _, l := range cfg.Listeners {
		if l.BindPort == statsPort {
			fmt.Fprintf(os.Stderr, "listener port %q is reserved and must not be used\n", l.BindPort)
			os.Exit(1)
		}
	}
	cfg.StatsPort = statsPort
	var b strings.Builder
	if err := template.Must(template.New("envoy-config").Parse(text)).Execute(&b, cfg); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Print(b.String())
}
