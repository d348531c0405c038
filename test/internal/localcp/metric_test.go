package localcp

import (
	"strings"
	"testing"
)

const scrape = `# HELP lockwarden_grant_transitions_total Grant transitions.
# TYPE lockwarden_grant_transitions_total counter
lockwarden_grant_transitions_total{phase="Held",reason="Granted"} 7
lockwarden_grant_transitions_total{phase="Expired",reason="FENCE_REGRESSION"} 2
# HELP leader_election_master_status Whether this replica leads.
# TYPE leader_election_master_status gauge
leader_election_master_status{name="lockwarden"} 1
# HELP lockwarden_grant_wait_seconds Wait before a grant.
# TYPE lockwarden_grant_wait_seconds histogram
lockwarden_grant_wait_seconds_bucket{le="1"} 3
lockwarden_grant_wait_seconds_bucket{le="+Inf"} 4
lockwarden_grant_wait_seconds_sum 2.5
lockwarden_grant_wait_seconds_count 4
`

func TestSeriesValue(t *testing.T) {
	tests := []struct {
		name, metric, labels string
		want                 float64
		lines                int
	}{
		{"one label of two", "lockwarden_grant_transitions_total", `reason="FENCE_REGRESSION"`, 0, 2},
		{"both labels", "lockwarden_grant_transitions_total", `phase="Expired",reason="FENCE_REGRESSION"`, 2, 2},
		{"a gauge", "leader_election_master_status", `name="lockwarden"`, 1, 1},
		{"another series of it", "leader_election_master_status", `name="other"`, 0, 1},
		{"an absent metric", "nope_total", ``, 0, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			v, lines, err := seriesValue(scrape, tc.metric, tc.labels)
			if err != nil {
				t.Fatal(err)
			}
			if v != tc.want || len(lines) != tc.lines {
				t.Fatalf("= %v, %q; want %v and %d lines", v, lines, tc.want, tc.lines)
			}
		})
	}
	if _, _, err := seriesValue("not { the format", "x", ""); err == nil || !strings.Contains(err.Error(), "parsing /metrics") {
		t.Fatalf("a malformed scrape: %v, want a parse error", err)
	}
}
