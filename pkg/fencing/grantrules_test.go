package fencing_test

import (
	"errors"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func TestCheckGrantOwner(t *testing.T) {
	checkRefusal(t, fencing.CheckGrantOwner("alice", "alice"), "", "")
	checkRefusal(t, fencing.CheckGrantOwner("bob", "alice"), fencing.ReasonNotOwner,
		`spec.owner "bob" must be the requesting user "alice" (leave it empty to default it)`)
}

func TestCheckSessionLease(t *testing.T) {
	good := fencing.SessionLease{Namespace: "billing", Name: "w", UID: "u1", Found: true, ActualUID: "u1",
		Labeled: true, Label: "locking.lockwarden.io/session", HasDuration: true, Holder: "alice", HasHolder: true}
	with := func(f func(*fencing.SessionLease)) fencing.SessionLease { l := good; f(&l); return l }
	cases := []struct {
		name   string
		l      fencing.SessionLease
		want   fencing.Reason
		detail string
	}{
		{"the owner's session", good, "", ""},
		{"gone", with(func(l *fencing.SessionLease) { l.Found = false }), fencing.ReasonSessionExpired, "session Lease billing/w does not exist"},
		{"replaced", with(func(l *fencing.SessionLease) { l.ActualUID = "u2" }), fencing.ReasonSessionExpired,
			"session Lease billing/w has uid u2, not u1: it was replaced"},
		{"not a session", with(func(l *fencing.SessionLease) { l.Labeled = false }), fencing.ReasonInvalidSpec,
			"Lease billing/w is not a session: it needs the label locking.lockwarden.io/session=true"},
		{"no duration", with(func(l *fencing.SessionLease) { l.HasDuration = false }), fencing.ReasonInvalidSpec,
			"session Lease billing/w has no spec.leaseDurationSeconds"},
		{"someone else's", with(func(l *fencing.SessionLease) { l.Holder = "bob" }), fencing.ReasonNotOwner,
			`session Lease billing/w is held by "bob", not by the requester "alice"`},
		{"no holder", with(func(l *fencing.SessionLease) { l.Holder, l.HasHolder = "", false }), fencing.ReasonNotOwner,
			`session Lease billing/w is held by "", not by the requester "alice"`},
		{"replaced comes before the label", with(func(l *fencing.SessionLease) { l.ActualUID, l.Labeled = "u2", false }), fencing.ReasonSessionExpired, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) { checkRefusal(t, fencing.CheckSessionLease(c.l, "alice"), c.want, c.detail) })
	}
}

// asked is an answer that counts how often it was asked.
type asked struct {
	n       int
	allowed bool
	err     error
}

func (a *asked) answer() (bool, error) { a.n++; return a.allowed, a.err }

func TestCheckGrantMetadata(t *testing.T) {
	failed := errors.New("authorization unavailable")
	cases := []struct {
		name    string
		caller  string
		changed bool
		answer  asked
		want    fencing.Reason
		err     error
		asks    int
		detail  string
	}{
		{"the owner", "alice", true, asked{}, "", nil, 0, ""},
		{"metadata unchanged", "bob", false, asked{}, "", nil, 0, ""},
		{"administrator", "bob", true, asked{allowed: true}, "", nil, 1, ""},
		{"anyone else", "bob", true, asked{}, fencing.ReasonNotOwner, nil, 1,
			`"bob" is not the owner of this grant; changing its labels, annotations, finalizers or owner references needs the "administer" verb on lockgrants`},
		{"authorization fails", "bob", true, asked{err: failed}, "", failed, 1, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := fencing.CheckGrantMetadata(c.caller, "alice", c.changed, c.answer.answer)
			if c.err != nil {
				if !errors.Is(err, c.err) || fencing.ReasonOf(err) != "" {
					t.Fatalf("got %v, want the authorization error as is", err)
				}
			} else {
				checkRefusal(t, err, c.want, c.detail)
			}
			if c.answer.n != c.asks {
				t.Fatalf("asked %d times, want %d", c.answer.n, c.asks)
			}
		})
	}
}

func TestCheckGrantDelete(t *testing.T) {
	failed := errors.New("authorization unavailable")
	cases := []struct {
		name        string
		caller      string
		ended       bool
		terminating bool
		requestID   string
		answer      asked
		forced      bool
		want        fencing.Reason
		err         error
		nsReads     int
		asks        int
		detail      string
	}{
		{"the owner", "alice", false, false, "", asked{}, false, "", nil, 0, 0, ""},
		{"an ended grant", "bob", true, false, "", asked{}, false, "", nil, 0, 0, ""},
		{"with its namespace", "bob", false, true, "", asked{}, false, "", nil, 1, 0, ""},
		{"forced release", "bob", false, false, "", asked{allowed: true}, true, "", nil, 1, 1, ""},
		{"without the verb", "bob", false, false, "", asked{}, false, fencing.ReasonNotOwner, nil, 1, 1,
			`"bob" is not the owner of this Held grant; deleting it is a forced release, which needs the "force-release" verb on lockgrants`},
		{"authorization fails", "bob", false, false, "", asked{err: failed}, false, "", failed, 1, 1, ""},
		// A live grant of a request ID its user chose: deleted, the ID
		// would be forgotten and a retry would run again.
		{"the owner, a request ID of its choosing", "alice", false, false, "nightly-2026-12-03", asked{}, false, fencing.ReasonRequestIDLive, nil, 1, 0,
			`this Held grant was made with request ID "nightly-2026-12-03": deleting it would forget the ID, and a retry with it would run again; release it (spec.release: true) instead, and it is recorded as spent before it is deleted`},
		{"the owner, an ended grant of a request ID", "alice", true, false, "nightly-2026-12-03", asked{}, false, "", nil, 0, 0, ""},
		{"the owner, a request ID, its namespace deleted", "alice", false, true, "nightly-2026-12-03", asked{}, false, "", nil, 1, 0, ""},
		{"forced release of a request ID's grant", "bob", false, false, "nightly-2026-12-03", asked{allowed: true}, true, "", nil, 1, 1, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reads := 0
			forced, err := fencing.CheckGrantDelete(fencing.GrantDelete{
				Caller: c.caller, Owner: "alice", Phase: "Held", Ended: c.ended, RequestID: c.requestID,
				NamespaceTerminating: func() bool { reads++; return c.terminating },
				ForceRelease:         c.answer.answer,
			})
			if c.err != nil {
				if !errors.Is(err, c.err) || fencing.ReasonOf(err) != "" {
					t.Fatalf("got %v, want the authorization error as is", err)
				}
			} else {
				checkRefusal(t, err, c.want, c.detail)
			}
			if forced != c.forced || reads != c.nsReads || c.answer.n != c.asks {
				t.Fatalf("forced %v after %d namespace reads and %d authorizations, want %v, %d, %d",
					forced, reads, c.answer.n, c.forced, c.nsReads, c.asks)
			}
		})
	}
}

// An ended grant of a request ID its user chose is its ID's only record
// until the registry records the ID as spent: deleted before, a retry with
// the ID would run the attempt again.
func TestCheckGrantDeleteOfAnEndedGrantOfARequestID(t *testing.T) {
	ended := time.Date(2026, 12, 3, 2, 0, 41, 500_000_000, time.UTC)
	const window = 7 * 24 * time.Hour
	unreadable := errors.New("ledger unreadable")
	record := func(spentUntil time.Time) *fencing.SpentRequest {
		return &fencing.SpentRequest{RequestID: "nightly-2026-12-03", State: fencing.StateReleased, EndedAt: ended.Truncate(time.Second), SpentUntil: spentUntil}
	}
	cases := []struct {
		name        string
		requestID   string
		now         time.Time
		window      time.Duration
		terminating bool
		spent       *fencing.SpentRequest
		readErr     error
		want        fencing.Reason
		err         error
		reads       int
	}{
		{"not recorded yet", "nightly-2026-12-03", ended.Add(time.Minute), window, false, nil, nil, fencing.ReasonRequestIDLive, nil, 1},
		// The record keeps seconds: the ledger's copy of the window's end
		// is truncated.
		{"recorded", "nightly-2026-12-03", ended.Add(time.Hour), window, false, record(ended.Add(window).Truncate(time.Second)), nil, "", nil, 1},
		{"recorded for an earlier attempt only", "nightly-2026-12-03", ended.Add(time.Hour), window, false, record(ended.Add(window - time.Hour).Truncate(time.Second)), nil, fencing.ReasonRequestIDLive, nil, 1},
		{"the ledger cannot be read", "nightly-2026-12-03", ended.Add(time.Hour), window, false, nil, unreadable, "", unreadable, 1},
		{"its namespace deleted", "nightly-2026-12-03", ended.Add(time.Minute), window, true, nil, nil, "", nil, 0},
		{"no window: nothing is recorded", "nightly-2026-12-03", ended.Add(time.Minute), 0, false, nil, nil, "", nil, 0},
		{"its record would be forgotten by now", "nightly-2026-12-03", ended.Add(2 * window), window, false, nil, nil, "", nil, 0},
		{"within the warning period", "nightly-2026-12-03", ended.Add(window + time.Hour), window, false, nil, nil, fencing.ReasonRequestIDLive, nil, 1},
		{"no chosen request ID", "", ended.Add(time.Minute), window, false, nil, nil, "", nil, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reads := 0
			for _, caller := range []string{"alice", "bob"} { // the owner, or anyone with delete rights
				forced, err := fencing.CheckGrantDelete(fencing.GrantDelete{
					Caller: caller, Owner: "alice", Phase: "Released", Ended: true, RequestID: c.requestID,
					EndedAt: ended, Now: c.now, Window: c.window,
					NamespaceTerminating: func() bool { return c.terminating },
					Recorded: func() (bool, error) {
						reads++
						return c.spent.Records(ended, c.window), c.readErr
					},
					ForceRelease: func() (bool, error) {
						t.Fatal("an ended grant's delete asked for the force-release verb")
						return false, nil
					},
				})
				if forced {
					t.Fatalf("%s: an ended grant's delete counted as a forced release", caller)
				}
				if c.err != nil {
					if !errors.Is(err, c.err) || fencing.ReasonOf(err) != "" {
						t.Fatalf("%s: got %v, want the read error as is", caller, err)
					}
				} else {
					checkRefusal(t, err, c.want, "")
				}
			}
			if reads != 2*c.reads {
				t.Fatalf("read the ledger %d times for two deletes, want %d", reads, 2*c.reads)
			}
		})
	}
}
