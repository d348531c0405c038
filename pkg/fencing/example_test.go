package fencing_test

import (
	"fmt"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// A holder paused past its lease: B was granted fence 2 while A slept, and
// A's late write with fence 1 is refused at the resource.
func ExampleCheckWrite() {
	now := time.Date(2026, 7, 19, 0, 0, 16, 0, time.UTC)
	a := &fencing.Grant{UID: "a", Resource: "invoice-batch/2026-07-19", Owner: "A", State: fencing.StateExpired, Fence: 1, ExpiresAt: now.Add(-6 * time.Second)}
	err := fencing.CheckWrite(fencing.Write{
		Resource: "invoice-batch/2026-07-19",
		Caller:   "A",
		Fence:    1,
		Recorded: 2, // B's write was accepted.
		Grant:    a,
		Counter:  &fencing.Counter{Fence: 2, HolderUID: "b"},
		Now:      now,
	})
	fmt.Println(fencing.ReasonOf(err))
	// Output: STALE_OWNER
}

func ExampleParseFence() {
	_, err := fencing.ParseFence("007")
	fmt.Println(err)
	// Output: NO_FENCE: fence "007" is not a positive decimal integer
}
