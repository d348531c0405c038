package grantplan

import (
	"testing"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// A pass reads the holder grant directly only where its listed copy may
// mislead the decision, and puts what it read in the list.
func TestHolderReadNeeded(t *testing.T) {
	a := held(grant("a", 0, 5), 1, 5)
	live := counter(1, &a).Spec.Holder // lease end t=5
	legacy := legacyCounter(1, &a).Spec.Holder
	released := a
	released.Spec.Release = true
	listed := []lockingv1alpha1.LockGrant{a}
	for _, tc := range []struct {
		name   string
		grants []lockingv1alpha1.LockGrant
		h      *lockingv1alpha1.FenceHolder
		now    float64
		want   bool
	}{
		{"listed, lease live", listed, live, 4, false},
		{"not listed", nil, live, 4, true},
		{"lease over by the counter", listed, live, 5, true},
		{"counter without the lease", listed, legacy, 1, true},
		{"listed asking for release", []lockingv1alpha1.LockGrant{released}, live, 9, false},
	} {
		if got := HolderReadNeeded(tc.grants, tc.h, sec(tc.now)); got != tc.want {
			t.Errorf("%s: HolderReadNeeded = %v, want %v", tc.name, got, tc.want)
		}
	}

	renewed := a
	renewed.Spec.Renewals = 1
	if got := WithHolder([]lockingv1alpha1.LockGrant{a, grant("b", 1, 5)}, live, &renewed); len(got) != 2 || got[0].Spec.Renewals != 1 {
		t.Errorf("WithHolder(read) = %+v, want a's listed copy replaced by the read", got)
	}
	if got := WithHolder([]lockingv1alpha1.LockGrant{a, grant("b", 1, 5)}, live, nil); len(got) != 1 || got[0].Name != "b" {
		t.Errorf("WithHolder(gone) = %+v, want a removed", got)
	}
	other := grant("a", 2, 5) // a new grant under the holder's name
	other.UID = "another-uid"
	if got := WithHolder([]lockingv1alpha1.LockGrant{a}, live, &other); len(got) != 0 {
		t.Errorf("WithHolder(same name, other UID) = %+v, want the holder removed", got)
	}
	if got := WithHolder(nil, live, &a); len(got) != 1 || got[0].UID != a.UID {
		t.Errorf("WithHolder(unlisted) = %+v, want a added", got)
	}
}
