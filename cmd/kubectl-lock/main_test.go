package main

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/cli-runtime/pkg/genericiooptions"

	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

func TestClassify(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want int
	}{
		{lock.ErrWaitTimeout, exitNotAcquired},
		{fmt.Errorf("acquiring: %w", lock.ErrBusy), exitNotAcquired},
		{fmt.Errorf("renewing: %w", &fencing.Error{Reason: fencing.ReasonExpired}), exitRefused},
		{errors.New("connection refused"), exitError},
		{&exitErr{code: exitLockLost}, exitLockLost},
	} {
		var ee *exitErr
		if !errors.As(classify(tc.err), &ee) || ee.code != tc.want {
			t.Errorf("classify(%v) = %v, want exit code %d", tc.err, classify(tc.err), tc.want)
		}
	}
}

func TestGrantKey(t *testing.T) {
	if got := grantKey("req-1", "billing"); got != (types.NamespacedName{Namespace: "billing", Name: "req-1"}) {
		t.Errorf("grantKey(NAME) = %v", got)
	}
	if got := grantKey("ops/req-1", "billing"); got != (types.NamespacedName{Namespace: "ops", Name: "req-1"}) {
		t.Errorf("grantKey(NAMESPACE/NAME) = %v", got)
	}
}

// --grace comes out of the lease: SIGKILL lands at the local deadline, so
// the grace is at most TTL - margin - 2 x TTL/3; the default is capped to
// it, an explicit one that does not fit is refused.
func TestFitGrace(t *testing.T) {
	for _, tc := range []struct {
		ttl, grace time.Duration
		explicit   bool
		want       time.Duration
		refused    bool
	}{
		{10 * time.Second, defaultGrace, false, 10*time.Second - time.Second - 2*(10*time.Second/3), false},
		{10 * time.Second, 10 * time.Second, true, 0, true},
		{10 * time.Second, 2 * time.Second, true, 2 * time.Second, false},
		{30 * time.Second, defaultGrace, false, 7 * time.Second, false},
		{60 * time.Second, defaultGrace, false, defaultGrace, false},
		{time.Second, defaultGrace, false, 0, false},
		{30 * time.Second, -time.Second, true, 0, true},
	} {
		got, err := fitGrace(tc.ttl, tc.grace, tc.explicit)
		if tc.refused != (err != nil) || (err != nil && !errors.Is(err, lock.ErrInvalidOption)) || got != tc.want {
			t.Errorf("fitGrace(%s, %s, %v) = %s, %v; want %s, refused %v", tc.ttl, tc.grace, tc.explicit, got, err, tc.want, tc.refused)
		}
	}
}

func TestVersion(t *testing.T) {
	var out bytes.Buffer
	code := execute([]string{"version"}, genericiooptions.IOStreams{In: &bytes.Buffer{}, Out: &out, ErrOut: &out})
	if code != 0 || !strings.HasPrefix(out.String(), "kubectl-lockwarden ") || !strings.Contains(out.String(), "(revision ") {
		t.Fatalf("version exited %d and printed %q", code, out.String())
	}
}
