package fencing_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckSession(t *testing.T) {
	t0 := time.Date(2026, 7, 19, 10, 0, 0, 0, time.UTC)
	live := &fencing.Session{UID: "u1", Holder: "alice", Duration: 5 * time.Second, ObservedAt: t0}
	cases := []struct {
		name  string
		s     *fencing.Session
		uid   string
		owner string
		now   time.Time
		want  fencing.Reason
	}{
		{"renewed just now", live, "u1", "alice", t0, ""},
		{"paused for the whole duration, still inside the margin", live, "u1", "alice", t0.Add(5*time.Second + 999*time.Millisecond), ""},
		{"lapsed at duration plus margin, equality included", live, "u1", "alice", t0.Add(6 * time.Second), fencing.ReasonSessionExpired},
		{"gone", nil, "u1", "alice", t0, fencing.ReasonSessionExpired},
		{"replaced under the same name", live, "u0", "alice", t0, fencing.ReasonSessionExpired},
		{"someone else's session", live, "u1", "bob", t0, fencing.ReasonSessionExpired},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := fencing.CheckSession(c.s, c.uid, c.owner, c.now)
			if got := fencing.ReasonOf(err); got != c.want {
				t.Fatalf("CheckSession = %v, want reason %q", err, c.want)
			}
			if c.want != "" && !errors.Is(err, fencing.ErrSessionExpired) {
				t.Fatalf("%v does not match ErrSessionExpired", err)
			}
		})
	}
}
