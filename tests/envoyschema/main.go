// Command envoyschema generates tunnel-agent's table of Envoy's v3 bootstrap
// schema (tunnel-agent/src/envoy_schema.rs) from the generated Go types of
// Envoy's data-plane API (go-control-plane), and its tests check that table
// and tunnel-agent's verdicts on bootstraps against go-control-plane's own
// protojson parsing and PGV validation.
//
//	go run -C tests/envoyschema . -write   # from the repository root
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
)

// repoRoot is the repository's root, found from this file's place.
func repoRoot() string {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return "."
	}
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// TablePath is where the generated table lives.
func TablePath() string {
	return filepath.Join(repoRoot(), "tunnel-agent", "src", "envoy_schema.rs")
}

// moduleVersion reads go.mod's requirement of Module.
func moduleVersion() (string, error) {
	b, err := os.ReadFile(filepath.Join(repoRoot(), "tests", "envoyschema", "go.mod"))
	if err != nil {
		return "", err
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(line), "require")))
		if len(f) >= 2 && f[0] == Module {
			return f[1], nil
		}
	}
	return "", fmt.Errorf("go.mod does not require %s", Module)
}

func main() {
	write := flag.Bool("write", false, "write "+TablePath()+" (default: say whether it is current)")
	flag.Parse()
	version, err := moduleVersion()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	table, unsupported, err := Generate(version)
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
	var kinds []string
	for k, n := range unsupported {
		kinds = append(kinds, fmt.Sprintf("%s (%d)", k, n))
	}
	sort.Strings(kinds)
	fmt.Fprintf(os.Stderr, "PGV rule kinds carried as Unsupported: %s\n", strings.Join(kinds, ", "))
	if *write {
		if err := os.WriteFile(TablePath(), table, 0o644); err != nil {
			fmt.Fprintln(os.Stderr, "error:", err)
			os.Exit(1)
		}
		fmt.Fprintf(os.Stderr, "wrote %s (%d bytes)\n", TablePath(), len(table))
		return
	}
	current, _ := os.ReadFile(TablePath())
	if !bytes.Equal(current, table) {
		fmt.Fprintf(os.Stderr, "%s is not current: run go run -C tests/envoyschema . -write\n", TablePath())
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "%s is current\n", TablePath())
}
