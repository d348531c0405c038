package main

import (
	"maps"
	"slices"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// promSample is one line of the Prometheus text format.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// promScrape is a scrape, keyed by the line's name and labels as written.
type promScrape map[string]promSample

// parseProm parses the Prometheus text format (with expfmt; histograms and
// summaries come out as their _bucket, _sum and _count lines), keeping only
// the metrics whose name starts with one of prefixes. A malformed scrape
// keeps what was read before the error.
func parseProm(text string, prefixes ...string) promScrape {
	out := promScrape{}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, _ := parser.TextToMetricFamilies(strings.NewReader(text))
	samples, _ := expfmt.ExtractSamples(&expfmt.DecodeOptions{}, slices.Collect(maps.Values(fams))...)
	for _, smp := range samples {
		name := string(smp.Metric[model.MetricNameLabel])
		if !slices.ContainsFunc(prefixes, func(p string) bool { return strings.HasPrefix(name, p) }) {
			continue
		}
		s := promSample{name: name, labels: map[string]string{}, value: float64(smp.Value)}
		for k, v := range smp.Metric {
			if k != model.MetricNameLabel {
				s.labels[string(k)] = string(v)
			}
		}
		out[smp.Metric.String()] = s
	}
	return out
}

// delta returns after minus before, line by line.
func delta(before, after promScrape) promScrape {
	out := promScrape{}
	for k, a := range after {
		d := a
		d.value -= before[k].value
		out[k] = d
	}
	return out
}

// sum adds up the values of the lines named name whose labels match every
// pair in match, grouped by the labels named in by (joined with " ").
func (p promScrape) sum(name string, match map[string]string, by ...string) map[string]float64 {
	out := map[string]float64{}
next:
	for _, s := range p {
		if s.name != name {
			continue
		}
		for k, v := range match {
			if s.labels[k] != v {
				continue next
			}
		}
		var parts []string
		for _, b := range by {
			parts = append(parts, s.labels[b])
		}
		out[strings.Join(parts, " ")] += s.value
	}
	return out
}
