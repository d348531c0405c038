package fencing_test

import (
	"errors"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

const segRes = "invoice-batch/2026-07-19"

// Digests of two different payloads of the same segment.
var (
	dig1 = fencing.PayloadDigest([]byte("invoices 1-100"))
	dig2 = fencing.PayloadDigest([]byte("invoices 1-100, amended"))
)

// held returns a Held grant of owner with fence, live until t=10.
func held(uid, owner string, fence int64) *fencing.Grant {
	return &fencing.Grant{UID: uid, Resource: segRes, Owner: owner, State: fencing.StateHeld, Fence: fence, ExpiresAt: at(10)}
}

func ended(g *fencing.Grant, s fencing.State) *fencing.Grant { g.State = s; return g }

// current is the registry's counter naming g as the holder.
func current(g *fencing.Grant) *fencing.Counter {
	return &fencing.Counter{Fence: g.Fence, HolderUID: g.UID}
}

func seg(g *fencing.Grant, root string, seq int64, digest string) fencing.Segment {
	return fencing.Segment{Fence: g.Fence, GrantUID: g.UID, Root: root, Seq: seq, Digest: digest}
}

func receipt(g *fencing.Grant, root string, seq int64, digest string) *fencing.Receipt {
	return &fencing.Receipt{ID: "r-" + root, Resource: segRes, Fence: g.Fence, GrantUID: g.UID, Root: root, Seq: seq, Digest: digest, AcceptedAt: at(1)}
}

func TestCheckSegment(t *testing.T) {
	a, b := held("uid-a", "A", 1), held("uid-b", "B", 2)
	ledgerA := func(root string, last int64) fencing.Ledger {
		return fencing.Ledger{Fence: 1, GrantUID: "uid-a", Root: root, LastSeq: last}
	}
	tests := []struct {
		name string
		w    fencing.SegmentWrite
		// want is the refusal reason; "" means admitted with verdict and next.
		want    fencing.Reason
		verdict fencing.Verdict
		next    fencing.Ledger
	}{
		{
			name:    "first segment of a fresh resource",
			w:       fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig1), Grant: a, Counter: current(a)},
			verdict: fencing.VerdictApply, next: ledgerA("X", 1),
		},
		{
			name:    "next segment under the same fence",
			w:       fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 1)},
			verdict: fencing.VerdictApply, next: ledgerA("X", 2),
		},
		{
			name:    "resend with the same payload returns the receipt",
			w:       fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 2), Prior: receipt(a, "X", 1, dig1), RootLastSeq: 2},
			verdict: fencing.VerdictDuplicate, next: ledgerA("X", 2),
		},
		{
			name: "resend with another payload",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig2), Grant: a, Counter: current(a), Ledger: ledgerA("X", 2), Prior: receipt(a, "X", 1, dig1), RootLastSeq: 2},
			want: fencing.ReasonSegmentConflict,
		},
		{
			name: "skipped sequence",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 3, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 1), RootLastSeq: 1},
			want: fencing.ReasonSequenceGap,
		},
		{
			name: "an earlier sequence without a receipt",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 2), RootLastSeq: 2},
			want: fencing.ReasonSequenceGap,
		},
		{
			// A released; B took fence 2 and wrote. A's segment 2 arrives.
			name: "smaller fence after release",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateReleased), Counter: current(b), Ledger: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "Y", LastSeq: 1}, RootLastSeq: 1},
			want: fencing.ReasonStaleOwner,
		},
		{
			// A holder paused past its lease, for segments: B is granted but has
			// not written yet.
			name: "smaller fence than the registry's, before the successor wrote",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateExpired), Counter: current(b), Ledger: ledgerA("X", 1), RootLastSeq: 1},
			want: fencing.ReasonStaleOwner,
		},
		{
			name: "smaller fence of an expired grant the registry still counts",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateExpired), Counter: &fencing.Counter{Fence: 1}, Ledger: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "Y", LastSeq: 1}},
			want: fencing.ReasonStaleOwner,
		},
		{
			// The registry was restored and names a grant of fence 2 as
			// the holder, but the resource accepted fence 3.
			name: "registry's current grant below the ledger",
			w:    fencing.SegmentWrite{Caller: "B", Segment: seg(b, "Y", 2, dig1), Grant: b, Counter: current(b), Ledger: fencing.Ledger{Fence: 3, GrantUID: "uid-c", Root: "Z", LastSeq: 1}},
			want: fencing.ReasonFenceRegression,
		},
		{
			// After the restore the next grant gets fence 3 again.
			name: "equal fence from another grant",
			w: func() fencing.SegmentWrite {
				c2 := held("uid-c2", "C", 3)
				return fencing.SegmentWrite{Caller: "C", Segment: seg(c2, "W", 1, dig1), Grant: c2, Counter: current(c2), Ledger: fencing.Ledger{Fence: 3, GrantUID: "uid-c", Root: "Z", LastSeq: 1}}
			}(),
			want: fencing.ReasonFenceRegression,
		},
		{
			name: "equal fence from another grant, even when that grant has expired",
			w: func() fencing.SegmentWrite {
				c2 := ended(held("uid-c2", "C", 3), fencing.StateExpired)
				return fencing.SegmentWrite{Caller: "C", Segment: seg(c2, "W", 1, dig1), Grant: c2, Counter: &fencing.Counter{Fence: 3}, Ledger: fencing.Ledger{Fence: 3, GrantUID: "uid-c", Root: "Z", LastSeq: 1}}
			}(),
			want: fencing.ReasonFenceRegression,
		},
		{
			name: "equal fence and grant, another operation root",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "Other", 1, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 1)},
			want: fencing.ReasonFenceRegression,
		},
		{
			name:    "a larger fence starts its own operation at segment 1",
			w:       fencing.SegmentWrite{Caller: "B", Segment: seg(b, "Y", 1, dig1), Grant: b, Counter: current(b), Ledger: ledgerA("X", 2)},
			verdict: fencing.VerdictApply, next: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "Y", LastSeq: 1},
		},
		{
			name: "a larger fence cannot start at segment 2",
			w:    fencing.SegmentWrite{Caller: "B", Segment: seg(b, "Y", 2, dig1), Grant: b, Counter: current(b), Ledger: ledgerA("X", 2)},
			want: fencing.ReasonSequenceGap,
		},
		{
			// W2 retries operation P under fence 2 and resends segment 1.
			name:    "a larger fence resends segment 1 and takes the operation over",
			w:       fencing.SegmentWrite{Caller: "B", Segment: seg(b, "P", 1, dig1), Grant: b, Counter: current(b), Ledger: ledgerA("P", 1), Prior: receipt(a, "P", 1, dig1), RootLastSeq: 1},
			verdict: fencing.VerdictDuplicate, next: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "P", LastSeq: 1},
		},
		{
			name:    "taking over an operation continues after its last accepted segment",
			w:       fencing.SegmentWrite{Caller: "B", Segment: seg(b, "P", 1, dig1), Grant: b, Counter: current(b), Ledger: fencing.Ledger{Fence: 1, GrantUID: "uid-a", Root: "Q", LastSeq: 4}, Prior: receipt(a, "P", 1, dig1), RootLastSeq: 3},
			verdict: fencing.VerdictDuplicate, next: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "P", LastSeq: 3},
		},
		{
			name: "a larger fence resends segment 1 with another payload",
			w:    fencing.SegmentWrite{Caller: "B", Segment: seg(b, "P", 1, dig2), Grant: b, Counter: current(b), Ledger: ledgerA("P", 1), Prior: receipt(a, "P", 1, dig1), RootLastSeq: 1},
			want: fencing.ReasonSegmentConflict,
		},
		{
			// Recovery from a restore: the issuer epoch was bumped.
			name: "a fence of a later issuer epoch resumes traffic",
			w: func() fencing.SegmentWrite {
				e := held("uid-e", "E", 1<<fencing.EpochBits|1)
				return fencing.SegmentWrite{Caller: "E", Segment: seg(e, "V", 1, dig1), Grant: e, Counter: current(e), Ledger: fencing.Ledger{Fence: 3, GrantUID: "uid-c", Root: "Z", LastSeq: 1}}
			}(),
			verdict: fencing.VerdictApply, next: fencing.Ledger{Fence: 1<<fencing.EpochBits | 1, GrantUID: "uid-e", Root: "V", LastSeq: 1},
		},
		{
			name: "a revoked grant with a fence below the ledger's",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateRevoked), Counter: &fencing.Counter{Fence: 1}, Ledger: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "Y", LastSeq: 1}},
			want: fencing.ReasonStaleOwner,
		},
		{
			name: "a revoked grant presenting the ledger's fence from another lease",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateRevoked), Counter: &fencing.Counter{Fence: 1}, Ledger: fencing.Ledger{Fence: 1, GrantUID: "uid-z", Root: "Z", LastSeq: 1}},
			want: fencing.ReasonFenceRegression,
		},
		{
			name: "a revoked holder",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateRevoked), Counter: current(a), Ledger: ledgerA("X", 1)},
			want: fencing.ReasonRevoked,
		},
		{
			name: "holder's lease is over",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 2, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 1), Now: at(10)},
			want: fencing.ReasonExpired,
		},
		{
			name: "an expired holder's resend gets no receipt (it looks it up instead)",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateExpired), Counter: &fencing.Counter{Fence: 1}, Ledger: ledgerA("X", 1), Prior: receipt(a, "X", 1, dig1), RootLastSeq: 1},
			want: fencing.ReasonExpired,
		},
		{
			name: "another identity",
			w:    fencing.SegmentWrite{Caller: "M", Segment: seg(a, "X", 2, dig1), Grant: a, Counter: current(a), Ledger: ledgerA("X", 1)},
			want: fencing.ReasonNotOwner,
		},
		{
			name: "another identity cannot raise the regression alarm",
			w:    fencing.SegmentWrite{Caller: "M", Segment: seg(b, "Y", 1, dig1), Grant: b, Counter: current(b), Ledger: fencing.Ledger{Fence: 2, GrantUID: "uid-x", Root: "Z", LastSeq: 1}},
			want: fencing.ReasonNotOwner,
		},
		{
			name: "another identity with a stale fence",
			w:    fencing.SegmentWrite{Caller: "M", Segment: seg(a, "X", 2, dig1), Grant: ended(held("uid-a", "A", 1), fencing.StateExpired), Counter: current(b), Ledger: fencing.Ledger{Fence: 2, GrantUID: "uid-b", Root: "Y", LastSeq: 1}},
			want: fencing.ReasonNotOwner,
		},
		{
			name: "unknown grant",
			w:    fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, dig1), Counter: current(a)},
			want: fencing.ReasonUnknownGrant,
		},
		{
			name: "registry's grant is not the segment's",
			w:    fencing.SegmentWrite{Caller: "A", Segment: fencing.Segment{Fence: 1, GrantUID: "uid-other", Root: "X", Seq: 1, Digest: dig1}, Grant: a, Counter: current(a)},
			want: fencing.ReasonBindingMismatch,
		},
		{
			name: "forged fence above the grant's",
			w:    fencing.SegmentWrite{Caller: "A", Segment: fencing.Segment{Fence: 1 << 62, GrantUID: "uid-a", Root: "X", Seq: 1, Digest: dig1}, Grant: a, Counter: current(a), Ledger: ledgerA("X", 1)},
			want: fencing.ReasonBindingMismatch,
		},
		{"no fence", fencing.SegmentWrite{Caller: "A", Segment: fencing.Segment{GrantUID: "uid-a", Root: "X", Seq: 1, Digest: dig1}, Grant: a, Counter: current(a)}, fencing.ReasonNoFence, 0, fencing.Ledger{}},
		{"no root", fencing.SegmentWrite{Caller: "A", Segment: seg(a, "", 1, dig1), Grant: a, Counter: current(a)}, fencing.ReasonInvalidSegment, 0, fencing.Ledger{}},
		{"sequence 0", fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 0, dig1), Grant: a, Counter: current(a)}, fencing.ReasonInvalidSegment, 0, fencing.Ledger{}},
		{"no digest", fencing.SegmentWrite{Caller: "A", Segment: seg(a, "X", 1, ""), Grant: a, Counter: current(a)}, fencing.ReasonInvalidSegment, 0, fencing.Ledger{}},
		{"no grant UID", fencing.SegmentWrite{Caller: "A", Segment: fencing.Segment{Fence: 1, Root: "X", Seq: 1, Digest: dig1}, Grant: a, Counter: current(a)}, fencing.ReasonInvalidSegment, 0, fencing.Ledger{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			tc.w.Resource = segRes
			if tc.w.Now.IsZero() {
				tc.w.Now = at(5)
			}
			d, err := fencing.CheckSegment(tc.w)
			if got := fencing.ReasonOf(err); got != tc.want {
				t.Fatalf("CheckSegment() = %+v, %v; want reason %q", d, err, tc.want)
			}
			if tc.want != "" {
				if !errors.Is(err, sentinelOf(tc.want)) {
					t.Fatalf("refusal %v does not match its sentinel", err)
				}
				return
			}
			if d.Verdict != tc.verdict || d.Next != tc.next {
				t.Fatalf("CheckSegment() = %v next %+v; want %v next %+v", d.Verdict, d.Next, tc.verdict, tc.next)
			}
			if d.Next.Fence < tc.w.Ledger.Fence {
				t.Fatalf("next ledger fence %d lowers %d", d.Next.Fence, tc.w.Ledger.Fence)
			}
			switch d.Verdict {
			case fencing.VerdictDuplicate:
				if d.Receipt != tc.w.Prior {
					t.Fatalf("duplicate returned receipt %+v, want the original %+v", d.Receipt, tc.w.Prior)
				}
			case fencing.VerdictApply:
				if d.Receipt != nil || tc.w.Prior != nil {
					t.Fatalf("apply of a segment that already has a receipt")
				}
			}
		})
	}
}

func sentinelOf(r fencing.Reason) error {
	return map[fencing.Reason]error{
		fencing.ReasonNoFence:         fencing.ErrNoFence,
		fencing.ReasonInvalidSegment:  fencing.ErrInvalidSegment,
		fencing.ReasonUnknownGrant:    fencing.ErrUnknownGrant,
		fencing.ReasonBindingMismatch: fencing.ErrBindingMismatch,
		fencing.ReasonNotOwner:        fencing.ErrNotOwner,
		fencing.ReasonStaleOwner:      fencing.ErrStaleOwner,
		fencing.ReasonExpired:         fencing.ErrExpired,
		fencing.ReasonFenceRegression: fencing.ErrFenceRegression,
		fencing.ReasonSequenceGap:     fencing.ErrSequenceGap,
		fencing.ReasonSegmentConflict: fencing.ErrSegmentConflict,
		fencing.ReasonRevoked:         fencing.ErrRevoked,
	}[r]
}

func TestSegmentReasonsHaveSentinels(t *testing.T) {
	for r, want := range map[fencing.Reason]error{
		fencing.ReasonInvalidSegment:  fencing.ErrInvalidSegment,
		fencing.ReasonSequenceGap:     fencing.ErrSequenceGap,
		fencing.ReasonSegmentConflict: fencing.ErrSegmentConflict,
		fencing.ReasonMutationUnknown: fencing.ErrMutationUnknown,
	} {
		if err := (&fencing.Error{Reason: r}); !errors.Is(err, want) {
			t.Errorf("%s does not unwrap to %v", r, want)
		}
	}
}

func TestResolveMutation(t *testing.T) {
	r := receipt(held("uid-a", "A", 1), "P", 2, dig1)
	tests := []struct {
		name    string
		ledger  fencing.Ledger
		receipt *fencing.Receipt
		attempt int64
		want    fencing.MutationState
	}{
		{"receipt found", fencing.Ledger{Fence: 1}, r, 1, fencing.MutationApplied},
		{"receipt found, written by a newer owner", fencing.Ledger{Fence: 2}, r, 1, fencing.MutationApplied},
		{"no receipt, a newer fence was accepted", fencing.Ledger{Fence: 2}, nil, 1, fencing.MutationAbsent},
		{"no receipt, the attempt's fence is still the highest", fencing.Ledger{Fence: 1}, nil, 1, fencing.MutationUnknown},
		{"no receipt, nothing accepted yet", fencing.Ledger{}, nil, 1, fencing.MutationUnknown},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := fencing.ResolveMutation(tc.ledger, tc.receipt, tc.attempt); got != tc.want {
				t.Fatalf("ResolveMutation() = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestPayloadDigest(t *testing.T) {
	if got, want := fencing.PayloadDigest(nil), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"; got != want {
		t.Fatalf("PayloadDigest(nil) = %s, want %s", got, want)
	}
	if dig1 == dig2 {
		t.Fatal("different payloads share a digest")
	}
}
