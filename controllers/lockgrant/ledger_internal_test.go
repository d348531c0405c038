package lockgrant

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

// The ledger keeps every ID within its window, whatever else it must
// drop: first the IDs whose window and warning period are over, then, when
// it is full, those kept only to warn; a new ID that finds no room keeps
// its grant instead.
func TestMergeSpent(t *testing.T) {
	day := 24 * time.Hour
	now := time.Date(2026, 12, 10, 0, 0, 0, 0, time.UTC)
	entry := func(id string, endedAgo time.Duration) lockingv1alpha1.SpentRequestID {
		ended := now.Add(-endedAgo)
		return lockingv1alpha1.SpentRequestID{RequestID: id, Phase: lockingv1alpha1.PhaseReleased,
			EndedAt: metav1.NewTime(ended), SpentUntil: metav1.NewTime(ended.Add(7 * day))}
	}
	ids := func(es []lockingv1alpha1.SpentRequestID) string {
		s := ""
		for _, e := range es {
			s += e.RequestID + " "
		}
		return s
	}
	for _, tc := range []struct {
		name       string
		entries    []lockingv1alpha1.SpentRequestID
		add        []lockingv1alpha1.SpentRequestID
		limit      int
		want, left string
	}{
		{"recorded, sorted", nil, []lockingv1alpha1.SpentRequestID{entry("b", 0), entry("a", 0)}, 10, "a b ", ""},
		{"forgotten after twice the window", []lockingv1alpha1.SpentRequestID{entry("old", 14*day), entry("warn", 10*day), entry("spent", day)}, nil, 10, "spent warn ", ""},
		{"full: warning-only entries make room, earliest first", []lockingv1alpha1.SpentRequestID{entry("w1", 12*day), entry("w2", 9*day), entry("s", day)},
			[]lockingv1alpha1.SpentRequestID{entry("new", 0)}, 3, "new s w2 ", ""},
		{"full of spent IDs: the new one finds no room", []lockingv1alpha1.SpentRequestID{entry("s1", day), entry("s2", 2*day)},
			[]lockingv1alpha1.SpentRequestID{entry("new", 0)}, 2, "s1 s2 ", "new"},
		{"recorded twice: the later window", []lockingv1alpha1.SpentRequestID{entry("a", 3*day)}, []lockingv1alpha1.SpentRequestID{entry("a", day)}, 10, "a ", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, left := mergeSpent(tc.entries, tc.add, now, tc.limit)
			l := ""
			for id := range left {
				l += id
			}
			if ids(got) != tc.want || l != tc.left {
				t.Fatalf("entries %q, no room for %q; want %q and %q", ids(got), l, tc.want, tc.left)
			}
			for _, e := range got {
				if e.RequestID == "a" && tc.name == "recorded twice: the later window" && !e.EndedAt.Equal(&metav1.Time{Time: now.Add(-day)}) {
					t.Fatalf("kept the earlier window: %+v", e)
				}
			}
		})
	}
}
