package main

import "testing"

// A guarded write refused because no webhook answered fails the run only
// when a replica was healthy and no fault had just begun.
func TestCheckWebhookAvailable(t *testing.T) {
	const unreachable = `Internal error occurred: failed calling webhook "mguard.locking.lockwarden.io": failed to call webhook: Post "https://localhost:1/mutate": context deadline exceeded`
	base := func() *history {
		h := &history{}
		// manager-1 is frozen from 1 s to 6 s; manager-0 killed from 10 s to 20 s.
		h.add(1000, "chaos", EventNote, NoteReplicaDown, Event{Detail: "manager-1 freeze"})
		h.add(6000, "chaos", EventNote, NoteReplicaUp, Event{Detail: "manager-1"})
		h.add(10000, "chaos", EventNote, NoteReplicaDown, Event{Detail: "manager-0 kill"})
		h.add(20000, "chaos", EventNote, NoteReplicaUp, Event{Detail: "manager-0"})
		return h
	}
	for _, tc := range []struct {
		name      string
		inv, done int
		violation bool
	}{
		{"right after a freeze began: excused", 1200, 2200, false},
		{"long into a freeze, the other replica healthy: refused", 4000, 5000, true},
		{"both healthy, no fault near: refused", 8000, 9000, true},
		{"right after a kill began: excused", 10100, 11100, false},
		{"one replica killed long before, the other healthy: refused", 15000, 16000, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := base()
			h.write("worker-0", "w1", tc.inv, tc.done, EventInfo, Event{Detail: unreachable, Fence: 1, Grant: "g"})
			vs, refused, _ := index(*h).checkWebhookAvailable()
			if refused[OpWrite] != 1 {
				t.Fatalf("refused = %v, want one write", refused)
			}
			if got := len(vs) > 0; got != tc.violation {
				t.Fatalf("violation = %v (%v), want %v", got, vs, tc.violation)
			}
		})
	}
	h := base()
	h.add(11000, "chaos", EventNote, NoteReplicaDown, Event{Detail: "manager-1 partition"})
	h.write("worker-0", "w2", 16000, 17000, EventInfo, Event{Detail: unreachable})
	if vs, _, _ := index(*h).checkWebhookAvailable(); len(vs) != 0 {
		t.Fatalf("with no replica healthy a refusal is fail-closed, not a violation: %v", vs)
	}
}
