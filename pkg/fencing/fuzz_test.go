package fencing_test

import (
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// FuzzParseFence checks that ParseFence accepts exactly the canonical
// decimal form: whatever it accepts formats back to the same string.
func FuzzParseFence(f *testing.F) {
	for _, s := range []string{"1", "0", "007", "-3", "9223372036854775807", "9223372036854775808", " 1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		v, err := fencing.ParseFence(s)
		if err != nil {
			if fencing.ReasonOf(err) != fencing.ReasonNoFence {
				t.Fatalf("ParseFence(%q) refused with %v, want NO_FENCE", s, err)
			}
			return
		}
		if v < 1 || fencing.FormatFence(v) != s {
			t.Fatalf("ParseFence(%q) = %d, which is not its canonical form", s, v)
		}
	})
}

// FuzzCheckWrite checks the safety properties of CheckWrite on arbitrary
// facts: an accepted write is never older than a recorded or issued fence,
// always carries exactly the grant's fence, comes from the owner, and falls
// inside a Held lease that the registry names as the holder.
func FuzzCheckWrite(f *testing.F) {
	f.Add(int64(1), int64(0), int64(1), int64(1), true, int64(10), int64(5), "A", "A", 1)
	f.Add(int64(1), int64(2), int64(1), int64(2), false, int64(10), int64(12), "A", "A", 2)
	f.Fuzz(func(t *testing.T, fence, recorded, grantFence, counterFence int64, holder bool, expires, now int64, owner, caller string, state int) {
		g := &fencing.Grant{UID: "g", Resource: "r", Owner: owner, State: fencing.State(((state % 6) + 6) % 6), Fence: grantFence, ExpiresAt: time.Unix(expires, 0)}
		c := &fencing.Counter{Fence: counterFence}
		if holder {
			c.HolderUID = "g"
		}
		w := fencing.Write{Resource: "r", Caller: caller, Fence: fence, Recorded: recorded, Grant: g, Counter: c, Now: time.Unix(now, 0)}
		if fencing.CheckWrite(w) != nil {
			return
		}
		switch {
		case fence < recorded || fence < counterFence:
			t.Fatalf("accepted stale fence %d (recorded %d, issued %d)", fence, recorded, counterFence)
		case fence != grantFence:
			t.Fatalf("accepted fence %d under a grant of fence %d", fence, grantFence)
		case caller != owner:
			t.Fatalf("accepted a write by %q for owner %q", caller, owner)
		case g.State != fencing.StateHeld || !holder || now >= expires:
			t.Fatalf("accepted a write outside a live lease: %+v holder=%v now=%d", g, holder, now)
		}
	})
}

// FuzzParseProof checks that the proof decoder never panics and accepts
// only proofs whose record re-encodes to the same canonical bytes.
func FuzzParseProof(f *testing.F) {
	f.Add(string(fencing.Sign(sampleRecord(), testKey("one"))))
	f.Add("lgv1.")
	f.Add("lgv1.c2NoZW1hOjEyOmxvY2tHcmFudC52MQo.AA")
	f.Fuzz(func(t *testing.T, s string) {
		r, sig, err := fencing.ParseProof(fencing.Proof(s))
		if err != nil {
			if fencing.ReasonOf(err) != fencing.ReasonBadSignature {
				t.Fatalf("refused with %v, want BAD_SIGNATURE", err)
			}
			return
		}
		if got := fencing.FormatProof(r, sig); got != fencing.Proof(s) {
			t.Fatalf("accepted a non-canonical proof: %q re-encodes to %q", s, got)
		}
	})
}

// FuzzCheckProvenWrite flips bytes of a valid proof: a changed proof is
// never accepted.
func FuzzCheckProvenWrite(f *testing.F) {
	key := testKey("one")
	good := fencing.Sign(sampleRecord(), key)
	f.Add(0, byte(1))
	f.Add(len(good)-1, byte(0x20))
	f.Fuzz(func(t *testing.T, pos int, flip byte) {
		if flip == 0 || pos < 0 || pos >= len(good) {
			return
		}
		b := []byte(good)
		b[pos] ^= flip
		r := sampleRecord()
		w := fencing.ProvenWrite{
			Proof:  fencing.Proof(b),
			Bundle: bundle(trusted("k1", key, fencing.KeyActive)),
			Policy: r.Policy, PolicyGeneration: r.PolicyGeneration,
			Write: fencing.Write{
				Resource: r.Resource, Caller: r.Owner, Fence: r.Fence,
				Grant:   &fencing.Grant{UID: r.LeaseID, Resource: r.Resource, Owner: r.Owner, State: fencing.StateHeld, Fence: r.Fence, ExpiresAt: time.Unix(100, 0)},
				Counter: &fencing.Counter{Fence: r.Fence, HolderUID: r.LeaseID},
				Now:     time.Unix(50, 0),
			},
		}
		if err := fencing.CheckProvenWrite(w); err == nil {
			t.Fatalf("accepted a proof changed at byte %d", pos)
		}
	})
}
