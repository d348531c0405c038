package sim

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

// The simulation plays thousands of rounds, minutes of CPU: make test-unit
// (go test -short) leaves it to make test-envtest and make test.
func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Fprintln(os.Stderr, "-short: skipping the fault simulation (thousands of rounds); make test-envtest and make test run it")
		return
	}
	os.Exit(m.Run())
}
