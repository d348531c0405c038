package cluster

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// hold is one acquisition of a resource by one holder, by the suite's
// clock.
type hold struct {
	fence    int64
	from, to time.Time
	// lost: the handle learned it no longer held before it released.
	lost bool
}

// traffic is holders and waiters on a few resources: each resource has
// several workers that acquire it, write its guarded ConfigMap under the
// fence, hold it a moment and release it, again and again, so that there is
// always a holder and a waiter.
type traffic struct {
	t      *testing.T
	ns     string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	holds    map[string][]hold
	acquired []time.Time
	failures []string
	// retries counts requests retried because no webhook replica decided
	// them; stopped those of them a stopping replica left undecided.
	retries, stopped int
}

// startTraffic starts workers per resource on n resources in ns; stop
// ends them and checks what they saw.
func startTraffic(t *testing.T, ns string, n, workers int) *traffic {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tr := &traffic{t: t, ns: ns, cancel: cancel, holds: map[string][]hold{}}
	locks := lock.NewClient(env.c, lock.WithNamespace(ns))
	for r := range n {
		resource := fmt.Sprintf("traffic/r%d", r)
		for range workers {
			tr.wg.Add(1)
			go func() {
				defer tr.wg.Done()
				for ctx.Err() == nil {
					tr.cycle(ctx, locks, resource)
				}
			}()
		}
	}
	t.Cleanup(func() { tr.cancel(); tr.wg.Wait() })
	return tr
}

// cycle is one acquisition: acquire, write under the fence, release.
func (tr *traffic) cycle(ctx context.Context, locks *lock.Client, resource string) {
	h, err := locks.Acquire(ctx, resource, lock.WithTTL(10*time.Second), lock.WithWait(3*time.Minute))
	switch {
	case ctx.Err() != nil:
		return
	case webhookFailed(err):
		tr.retried(err)
		sleep(ctx, 200*time.Millisecond)
		return
	case err != nil:
		tr.fail("acquiring %s: %v", resource, err)
		sleep(ctx, time.Second)
		return
	}
	hd := hold{fence: h.Info().Fence, from: time.Now()}
	tr.mu.Lock()
	tr.acquired = append(tr.acquired, hd.from)
	tr.mu.Unlock()
	if err := tr.write(ctx, h, resource); err != nil && ctx.Err() == nil && context.Cause(h.Context()) == nil {
		tr.fail("%s: the holder's write with fence %d: %v", resource, hd.fence, err)
	}
	sleep(ctx, 150*time.Millisecond)
	hd.to, hd.lost = time.Now(), context.Cause(h.Context()) != nil
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := h.Release(rctx); err != nil {
		hd.lost = true
		tr.fail("%s: releasing fence %d at %s, acquired at %s (held %.1fs, release took %.1fs): %v", resource, hd.fence,
			hd.to.Format(time.StampMilli), hd.from.Format(time.StampMilli), hd.to.Sub(hd.from).Seconds(), time.Since(hd.to).Seconds(), err)
	}
	tr.mu.Lock()
	tr.holds[resource] = append(tr.holds[resource], hd)
	tr.mu.Unlock()
}

// write stores the holder's fence in the resource's guarded ConfigMap.
func (tr *traffic) write(ctx context.Context, h *lock.Handle, resource string) error {
	name := "holder-" + resource[len("traffic/"):]
	for {
		cm := &corev1.ConfigMap{}
		err := env.c.Get(ctx, types.NamespacedName{Namespace: tr.ns, Name: name}, cm)
		create := apierrors.IsNotFound(err)
		switch {
		case create:
			cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: tr.ns, Name: name,
				Labels:      map[string]string{lockingv1alpha1.GuardedLabel: "true"},
				Annotations: map[string]string{lockingv1alpha1.ResourceAnnotation: resource}}}
		case err != nil:
			return err
		}
		cm.Data = map[string]string{"fence": fmt.Sprint(h.Info().Fence)}
		if err := h.Stamp(cm); err != nil {
			return err
		}
		if create {
			err = env.c.Create(ctx, cm)
		} else {
			err = env.c.Update(ctx, cm)
		}
		switch {
		case apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err):
			continue
		case webhookFailed(err) && context.Cause(h.Context()) == nil:
			// The replica the Service chose is gone (a killed container, a
			// rolled Pod): the write was refused without a decision, and the
			// writer retries.
			tr.retried(err)
			sleep(ctx, 200*time.Millisecond)
			continue
		}
		return err
	}
}

// webhookFailed reports whether err is a request refused because no webhook
// replica decided it: the API server could not reach one in time, or the one
// it reached failed its reads (a replica stopping mid-request; the
// LockGrant webhook reports that as a denial, 403, without a reason code).
// The request changed nothing, so the client retries it; a decision, with
// its reason code, is never retried.
func webhookFailed(err error) bool {
	if err == nil || !strings.Contains(err.Error(), "webhook") {
		return false
	}
	msg := err.Error()
	return strings.Contains(msg, "failed calling webhook") || strings.Contains(msg, "context canceled") ||
		strings.Contains(msg, "context deadline exceeded")
}

// stopping reports whether err is a request left undecided because the
// replica it reached stopped (not because it was slow).
func stopping(err error) bool {
	msg := err.Error()
	return !strings.Contains(msg, "context deadline exceeded") &&
		(strings.Contains(msg, "context canceled") || strings.Contains(msg, "connection refused") ||
			strings.Contains(msg, "EOF") || strings.Contains(msg, "connection reset"))
}

// stoppedSoFar is how many requests a stopping replica left undecided so
// far.
func (tr *traffic) stoppedSoFar() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return tr.stopped
}

// retried counts a request retried because err left it undecided, and
// logs it.
func (tr *traffic) retried(err error) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.retries++
	if stopping(err) {
		tr.stopped++
	}
	tr.t.Logf("%s: retrying: %v", time.Now().Format(time.StampMilli), err)
}

func (tr *traffic) fail(format string, args ...any) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	tr.failures = append(tr.failures, fmt.Sprintf(format, args...))
}

// count is how many acquisitions there were so far.
func (tr *traffic) count() int {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.acquired)
}

// flowing waits until n more grants were acquired.
func (tr *traffic) flowing(t *testing.T, n int, timeout time.Duration) {
	t.Helper()
	want := tr.count() + n
	eventually(t, fmt.Sprintf("%d more grants are acquired", n), timeout, func(context.Context) (bool, error) {
		return tr.count() >= want, errors.New("not yet")
	})
}

// stop ends the traffic and checks it: every acquisition held and released
// its grant and wrote under it; per resource the fences strictly increase
// in the order the holders held, and no two holders held at once. It
// returns the longest time between two acquisitions (of any resource)
// since since.
func (tr *traffic) stop(t *testing.T, since time.Time) time.Duration {
	t.Helper()
	tr.cancel()
	tr.wg.Wait()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	for _, f := range tr.failures {
		t.Error(f)
	}
	total := 0
	for resource, hs := range tr.holds {
		slices.SortFunc(hs, func(a, b hold) int { return a.from.Compare(b.from) })
		total += len(hs)
		for i := 1; i < len(hs); i++ {
			prev, cur := hs[i-1], hs[i]
			if cur.fence <= prev.fence {
				t.Errorf("%s: fence %d held after fence %d: fences must strictly increase", resource, cur.fence, prev.fence)
			}
			if cur.from.Before(prev.to) && !prev.lost {
				t.Errorf("%s: fence %d held from %s while fence %d was held until %s: two holders", resource, cur.fence,
					cur.from.Format(time.StampMilli), prev.fence, prev.to.Format(time.StampMilli))
			}
		}
	}
	var longest time.Duration
	times := slices.Clone(tr.acquired)
	slices.SortFunc(times, func(a, b time.Time) int { return a.Compare(b) })
	prev := since
	for _, at := range times {
		if at.Before(since) {
			continue
		}
		longest = max(longest, at.Sub(prev))
		prev = at
	}
	t.Logf("grant traffic: %d acquisitions on %d resources, longest stall %.1fs, %d requests retried because no webhook replica decided them",
		total, len(tr.holds), longest.Seconds(), tr.retries)
	return longest
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
