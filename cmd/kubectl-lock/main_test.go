package main

import (
	"errors"
	"fmt"
	"testing"

	"k8s.io/apimachinery/pkg/types"

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
