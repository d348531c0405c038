package main

import (
	"bufio"
	"strconv"
	"strings"
)

// promSample is one line of the Prometheus text format.
type promSample struct {
	name   string
	labels map[string]string
	value  float64
}

// promScrape is a scrape, keyed by the line's name and labels as written.
type promScrape map[string]promSample

// parseProm parses the Prometheus text format, keeping only the metrics
// whose name starts with one of prefixes.
func parseProm(text string, prefixes ...string) promScrape {
	out := promScrape{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		keep := false
		for _, p := range prefixes {
			if strings.HasPrefix(line, p) {
				keep = true
				break
			}
		}
		if !keep {
			continue
		}
		sp := strings.LastIndexByte(line, ' ')
		if sp < 0 {
			continue
		}
		key := line[:sp]
		v, err := strconv.ParseFloat(line[sp+1:], 64)
		if err != nil {
			continue
		}
		s := promSample{labels: map[string]string{}, value: v}
		if i := strings.IndexByte(key, '{'); i >= 0 {
			s.name = key[:i]
			parseLabels(key[i+1:len(key)-1], s.labels)
		} else {
			s.name = key
		}
		out[key] = s
	}
	return out
}

func parseLabels(s string, into map[string]string) {
	for s != "" {
		eq := strings.IndexByte(s, '=')
		if eq < 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return
		}
		name := s[:eq]
		rest := s[eq+2:]
		var val strings.Builder
		i := 0
		for ; i < len(rest); i++ {
			if rest[i] == '\\' && i+1 < len(rest) {
				i++
				val.WriteByte(rest[i])
				continue
			}
			if rest[i] == '"' {
				break
			}
			val.WriteByte(rest[i])
		}
		into[name] = val.String()
		s = strings.TrimPrefix(rest[min(i+1, len(rest)):], ",")
	}
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
