package fencing_test

import (
	"fmt"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A retry of operation P by a new owner: W1 wrote segment 1
// under fence 1 and froze; W2 got fence 2 for the same operation and resends
// segment 1 with the same payload. It gets W1's receipt back, nothing is
// applied a second time, and the resource now expects segment 2 under
// fence 2.
func ExampleCheckSegment() {
	now := time.Date(2026, 7, 19, 0, 0, 20, 0, time.UTC)
	payload := fencing.PayloadDigest([]byte(`{"invoices":["INV-1","INV-2"]}`))
	w2 := &fencing.Grant{UID: "uid-w2", Resource: "invoice-batch/2026-07-19", Owner: "W2", State: fencing.StateHeld, Fence: 2, ExpiresAt: now.Add(10 * time.Second)}
	r1 := &fencing.Receipt{ID: "r1", Resource: "invoice-batch/2026-07-19", Fence: 1, GrantUID: "uid-w1", Root: "P", Seq: 1, Digest: payload}

	d, err := fencing.CheckSegment(fencing.SegmentWrite{
		Resource:    "invoice-batch/2026-07-19",
		Caller:      "W2",
		Segment:     fencing.Segment{Fence: 2, GrantUID: "uid-w2", Root: "P", Seq: 1, Digest: payload},
		Grant:       w2,
		Counter:     &fencing.Counter{Fence: 2, HolderUID: "uid-w2"},
		Now:         now,
		Ledger:      fencing.Ledger{Fence: 1, GrantUID: "uid-w1", Root: "P", LastSeq: 1},
		Prior:       r1,
		RootLastSeq: 1,
	})
	fmt.Println(d.Verdict, d.Receipt.ID, err)
	fmt.Printf("next: fence %d, segment %d of %s\n", d.Next.Fence, d.Next.LastSeq+1, d.Next.Root)
	// Output:
	// Duplicate r1 <nil>
	// next: fence 2, segment 2 of P
}

// The coordinator was restored from an old snapshot: its counter
// went back to 2 and it issues fence 3 a second time, to a new grant. The
// resource accepted fence 3 from another grant before the restore, so it
// refuses, and keeps its highest fence.
func ExampleCheckSegment_fenceRegression() {
	now := time.Date(2026, 7, 19, 0, 1, 0, 0, time.UTC)
	again := &fencing.Grant{UID: "uid-new", Resource: "invoice-batch/2026-07-19", Owner: "C", State: fencing.StateHeld, Fence: 3, ExpiresAt: now.Add(10 * time.Second)}
	_, err := fencing.CheckSegment(fencing.SegmentWrite{
		Resource: "invoice-batch/2026-07-19",
		Caller:   "C",
		Segment:  fencing.Segment{Fence: 3, GrantUID: "uid-new", Root: "W", Seq: 1, Digest: fencing.PayloadDigest([]byte("w1"))},
		Grant:    again,
		Counter:  &fencing.Counter{Fence: 3, HolderUID: "uid-new"},
		Now:      now,
		Ledger:   fencing.Ledger{Fence: 3, GrantUID: "uid-before-restore", Root: "Z", LastSeq: 1},
	})
	fmt.Println(fencing.ReasonOf(err))
	// Output: FENCE_REGRESSION
}

// A write under fence 1 lost its acknowledgement. While fence 1 is still
// the resource's highest, a missing receipt proves nothing; once fence 2
// has written, the attempt can never land and may be redone.
func ExampleResolveMutation() {
	fmt.Println(fencing.ResolveMutation(fencing.Ledger{Fence: 1}, nil, 1))
	fmt.Println(fencing.ResolveMutation(fencing.Ledger{Fence: 2}, nil, 1))
	fmt.Println(fencing.ResolveMutation(fencing.Ledger{Fence: 2}, &fencing.Receipt{ID: "r2"}, 1))
	// Output:
	// Unknown
	// Absent
	// Applied
}
