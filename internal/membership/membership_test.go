package membership

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)

func TestLive(t *testing.T) {
	members := []Member{
		{ID: "a", RenewTime: t0, Duration: 2 * time.Second},
		{ID: "b", RenewTime: t0.Add(-2 * time.Second), Duration: 2 * time.Second}, // lapsed exactly now
		{ID: "c", RenewTime: t0.Add(-time.Second), Duration: 2 * time.Second},
		{ID: "", RenewTime: t0, Duration: time.Hour},
	}
	for _, tc := range []struct {
		name string
		self string
		now  time.Time
		want []string
	}{
		{"fresh members and self", "self", t0, []string{"a", "c", "self"}},
		{"self listed once", "a", t0, []string{"a", "c"}},
		{"self is live even with a lapsed Lease", "b", t0, []string{"a", "b", "c"}},
		{"later, only the freshest", "self", t0.Add(1500 * time.Millisecond), []string{"a", "self"}},
		{"all lapsed", "self", t0.Add(time.Minute), []string{"self"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Live(members, tc.self, tc.now); !slices.Equal(got, tc.want) {
				t.Fatalf("Live = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPreferredIsAgreedAndBalanced(t *testing.T) {
	live := []string{"manager-a", "manager-b"}
	count := map[string]int{}
	for i := range 10000 {
		key := fmt.Sprintf("ns-%d/fc-%d", i%7, i)
		p := Preferred(key, live)
		if q := Preferred(key, []string{"manager-b", "manager-a"}); q != p {
			t.Fatalf("%s: the order of the members changed the choice: %s vs %s", key, p, q)
		}
		count[p]++
	}
	for _, id := range live {
		if count[id] < 4500 || count[id] > 5500 {
			t.Fatalf("unbalanced: %v", count)
		}
	}
	if Preferred("x", nil) != "" {
		t.Fatal("no live member must prefer nobody")
	}
}

// A member that leaves moves only the resources it was preferred for.
func TestPreferredMovesOnlyTheLeaversKeys(t *testing.T) {
	all := []string{"a", "b", "c"}
	rest := []string{"a", "c"}
	moved := 0
	for i := range 3000 {
		key := fmt.Sprintf("k%d", i)
		before, after := Preferred(key, all), Preferred(key, rest)
		if before != "b" && before != after {
			t.Fatalf("%s moved from %s to %s though %s stayed", key, before, after, before)
		}
		if before == "b" {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("b was preferred for nothing")
	}
}
