package main

import (
	"strings"
	"testing"
	"time"
)

func TestPermitsMarkdown(t *testing.T) {
	md := permitsMarkdown([]permitsResult{
		{permits: 1, workers: 2, rate: 20, lat: summary{p50: 40, p99: 90}},
		{permits: 4, workers: 8, rate: 50, lat: summary{p50: 70, p99: 150}},
	}, 2*time.Second)
	t.Logf("\n%s", md)
	for _, want := range []string{"| permits | workers | cycles/s |", "| 1 | 2 | 20.0 | 40.00 | 90.00 | 1.00× |", "| 4 | 8 | 50.0 | 70.00 | 150 | 2.50× |", "2s each"} {
		if !strings.Contains(md, want) {
			t.Errorf("permits table lacks %q", want)
		}
	}
}
