package main

import (
	"bytes"
	"os"
	"testing"
)

// TestTableIsCurrent is the drift test: the checked-in table must be what
// go.mod's go-control-plane gives, so a version bump cannot leave
// tunnel-agent on an older schema (run go run -C tests/envoyschema . -write).
func TestTableIsCurrent(t *testing.T) {
	version, err := moduleVersion()
	if err != nil {
		t.Fatal(err)
	}
	want, unsupported, err := Generate(version)
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(TablePath())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not what %s %s gives: run go run -C tests/envoyschema . -write", TablePath(), Module, version)
	}
	// Every PGV rule kind in the schema is one the agent enforces.
	if len(unsupported) != 0 {
		t.Errorf("PGV rule kinds the table cannot express: %v", unsupported)
	}
}
