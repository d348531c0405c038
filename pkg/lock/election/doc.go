// Package election is leader election for controllers with fencing: the
// shape of client-go's tools/leaderelection (callbacks, IsLeader, a healthz
// check), built on lockwarden grants instead of a Lease record, so that
// every term of leadership has a fencing token and every write a leader
// makes to a guarded object carries it.
//
//	e, err := election.New(election.Config{
//		Client: c, Namespace: "ops", Resource: "controllers/invoice-operator",
//		Identity: podName, LeaseDuration: 15 * time.Second,
//		Callbacks: election.Callbacks{
//			OnStartedLeading: func(ctx context.Context, t *election.Term) {
//				w := t.Client(c) // stamps every write to a guarded object with the term's claim
//				...              // work until ctx is cancelled
//			},
//			OnStoppedLeading: func() { ... },
//			OnNewLeader:      func(identity string) { ... },
//		},
//	})
//	err = e.Run(ctx) // leads, loses, queues again, until ctx ends
//
// # Why
//
// client-go's leader election says of itself that it does not fence: a
// leader that stalls (a GC pause, a frozen VM, a partition) past its lease
// keeps acting on what it believed until it notices, and by then its
// successor is writing too. Here each term is one LockGrant on Resource: the
// registry grants one term at a time, in FIFO order, with a fencing token
// strictly larger than every earlier term's (Chubby's sequencer, Burrows,
// OSDI 2006; Kleppmann's fencing token, 2016). Writes stamped with the term's
// claim (Term.Stamp, Term.Client) are checked by lockwarden's guarded-write
// admission webhook in the same atomic step as the write: a deposed leader's
// write is refused (STALE_OWNER, EXPIRED, NOT_HELD, ...) however late it
// arrives.
//
// # What an Elector guarantees
//
//   - One term at a time per Elector: Run starts a term only after the
//     previous term's OnStartedLeading returned and OnStoppedLeading ran.
//   - The leader context given to OnStartedLeading is cancelled the moment
//     ownership is in doubt: the term's lock.Handle's Context ended (its
//     local deadline passed without a confirmed renewal, the grant expired,
//     was revoked or released), or Run's context ended. Its cause
//     (context.Cause) says which.
//   - After a term ends the Elector releases its grant (so a cancelled Run
//     hands over at once, like client-go's ReleaseOnCancel), calls
//     OnStoppedLeading, and queues for the next term with a new grant.
//   - Every write of Term.Client to a guarded object carries the term's
//     claim, and a write stamped after the term ended fails before it is
//     sent (lock.ErrOwnershipUnknown, lock.ErrLost, lock.ErrReleased).
//
// # What it does not guarantee
//
// Fencing protects only what an enforcement point checks: objects labeled
// locking.lockwarden.io/guarded=true (and stores that check segments).
// Writes to unguarded objects, to other systems, or through clients that do
// not stamp are as unfenced as with client-go. OnNewLeader reports the
// holder the resource's FenceCounter names, as the watch delivers it; two
// electors may briefly disagree about who leads, the fences never do.
//
// For controller-runtime managers, AddToManager runs an Elector as a
// manager runnable and builds the manager's controllers anew for each term,
// under the term's leader context and with the term's stamping client; see
// docs/leader-election.md.
package election
