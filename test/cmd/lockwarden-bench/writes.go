package main

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// writeVerbs are the API server's write verbs, as apiserver_request_total
// labels them.
var writeVerbs = []string{"POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION"}

// apiScraper reads the API server's request counters.
type apiScraper struct {
	cs *kubernetes.Clientset
}

func newAPIScraper(cp *controlPlane) (*apiScraper, error) {
	cs, err := kubernetes.NewForConfig(cp.clientConfig())
	if err != nil {
		return nil, err
	}
	return &apiScraper{cs: cs}, nil
}

func (a *apiScraper) scrape(ctx context.Context) (promScrape, error) {
	raw, err := a.cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, fmt.Errorf("scraping the API server's metrics: %w", err)
	}
	return parseProm(string(raw), "apiserver_request_total"), nil
}

// writes is the API writes between two scrapes: in all, and by
// resource[/subresource] and verb. A write the API server answered 409
// Conflict changed nothing: it is counted in conflicts, not in total.
type writes struct {
	total     float64
	by        map[string]float64
	conflicts float64
}

func writesBetween(before, after promScrape) writes {
	d := delta(before, after)
	w := writes{by: map[string]float64{}}
	for k, v := range d.sum("apiserver_request_total", nil, "verb", "resource", "subresource", "code") {
		f := strings.Split(k, " ")
		if len(f) < 4 || f[1] == "" || !slices.Contains(writeVerbs, f[0]) || v <= 0 {
			continue
		}
		if f[3] == "409" {
			w.conflicts += v
			continue
		}
		what := f[1]
		if f[2] != "" {
			what += "/" + f[2]
		}
		w.total += v
		w.by[what+" "+f[0]] += v
	}
	return w
}

// replace sets the count of key ("resource[/subresource] VERB") to v.
func (w *writes) replace(key string, v float64) {
	w.total += v - w.by[key]
	w.by[key] = v
}

// per returns the writes per operation, with the breakdown as text (409s
// last, apart).
func (w writes) per(ops int) (float64, string) {
	if ops == 0 {
		return 0, ""
	}
	keys := make([]string, 0, len(w.by))
	for k := range w.by {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int { return int(w.by[b] - w.by[a]) })
	var parts []string
	for _, k := range keys {
		if v := w.by[k] / float64(ops); v >= 0.05 {
			parts = append(parts, fmt.Sprintf("%s %.2f", k, v))
		}
	}
	if w.conflicts > 0 {
		parts = append(parts, fmt.Sprintf("and %.2f answered 409 Conflict (not counted)", w.conflicts/float64(ops)))
	}
	return w.total / float64(ops), strings.Join(parts, ", ")
}

// conflictsPer is the 409 Conflict answers per operation.
func (w writes) conflictsPer(ops int) float64 {
	if ops == 0 {
		return 0
	}
	return w.conflicts / float64(ops)
}
