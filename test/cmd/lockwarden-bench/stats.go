package main

import (
	"math"
	"slices"
	"time"
)

// series is the samples of one metric of one system, in milliseconds.
type series struct {
	system string
	metric string
	ms     []float64
}

func (s *series) add(d time.Duration) { s.ms = append(s.ms, float64(d)/float64(time.Millisecond)) }

// summary is the percentiles of a series.
type summary struct {
	n                  int
	p50, p90, p99, max float64
}

func summarize(ms []float64) summary {
	if len(ms) == 0 {
		return summary{p50: math.NaN(), p90: math.NaN(), p99: math.NaN(), max: math.NaN()}
	}
	s := slices.Clone(ms)
	slices.Sort(s)
	return summary{n: len(s), p50: quantile(s, 0.50), p90: quantile(s, 0.90), p99: quantile(s, 0.99), max: s[len(s)-1]}
}

// quantile of sorted samples, by linear interpolation between closest ranks.
func quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 1 {
		return sorted[0]
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}
