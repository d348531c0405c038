package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
)

// acquireOptions are the flags shared by acquire and run.
type acquireOptions struct {
	ttl       time.Duration
	wait      time.Duration
	lockDelay time.Duration
	requestID string
	permits   int32
	// releaseByDelete: run's --release-by-delete (acquire has no release
	// of its own: release --delete is its counterpart).
	releaseByDelete bool
}

func (o *acquireOptions) addFlags(cmd *cobra.Command) {
	cmd.Flags().DurationVar(&o.ttl, "ttl", lock.DefaultTTL, "Lease duration, whole seconds from 1s to 1h; the lease ends this long after the last renew.")
	cmd.Flags().DurationVar(&o.wait, "wait", 0, "How long to wait in the queue; 0 waits without limit. Exit code 124 when it passes.")
	cmd.Flags().DurationVar(&o.lockDelay, "lock-delay", 0, "If the lease ends without a release (expired, killed, revoked), nobody else gets the resource for this long, so that effects still in flight can drain (whole seconds, at most 1h).")
	cmd.Flags().Int32Var(&o.permits, "permits", 1, "How many holders RESOURCE admits at once, 1 to 64: a counted lock (semaphore) whose permits share one queue. The request holds one permit, and each permit has its own fence sequence and fenced resource ID (RESOURCE for permit 0, RESOURCE#k for permit k). Every request for RESOURCE should name the same number.")
	cmd.Flags().StringVar(&o.requestID, "request-id", "", "Idempotency key of the request (default: random). Retrying with the same ID finds the same grant instead of queuing again.")
}

func (o *acquireOptions) lockOptions() []lock.Option {
	opts := []lock.Option{lock.WithTTL(o.ttl), lock.WithWait(o.wait), lock.WithLockDelay(o.lockDelay)}
	if o.requestID != "" {
		opts = append(opts, lock.WithRequestID(o.requestID))
	}
	if o.permits != 1 {
		opts = append(opts, lock.WithPermits(o.permits))
	}
	if o.releaseByDelete {
		opts = append(opts, lock.WithReleaseByDelete())
	}
	return opts
}

// releaseByDeleteHelp is the help of run's --release-by-delete and
// release's --delete.
const releaseByDeleteHelp = "Release by deleting the grant instead of marking it released: one API write less and no webhook call on the handoff, but no Released record is left (list no longer shows the grant). Refused for a grant with a lock-delay or a request ID of its own."

// setKind fills in apiVersion and kind, which typed clients leave empty.
func setKind(o runtime.Object) {
	switch v := o.(type) {
	case *lockingv1alpha1.LockGrant:
		v.APIVersion, v.Kind = lockingv1alpha1.GroupVersion.String(), "LockGrant"
	case *lockingv1alpha1.LockGrantList:
		v.APIVersion, v.Kind = lockingv1alpha1.GroupVersion.String(), "LockGrantList"
		for i := range v.Items {
			setKind(&v.Items[i])
		}
	}
}

// timestamp formats a status time as RFC 3339, or "-".
func timestamp(t *metav1.MicroTime) string {
	if t == nil {
		return "-"
	}
	return t.UTC().Format(time.RFC3339Nano)
}

func (a *app) acquireCmd() *cobra.Command {
	var o acquireOptions
	pf := printFlags(true)
	cmd := &cobra.Command{
		Use:   "acquire RESOURCE",
		Short: "Take the lock on RESOURCE and print the grant, its fence and its UID",
		Long: `Take the lock on RESOURCE, waiting in its queue, and print the grant's name,
fence, expiry and UID. The lock is not renewed after the command exits: renew
it with 'kubectl lockwarden renew GRANT --uid UID' before the TTL runs out, and
release it with 'kubectl lockwarden release GRANT --uid UID', or use
'kubectl lockwarden run'. The UID names exactly this acquisition: with it,
renew and release never act on a later grant that reuses the name.
Acquiring again with the same --request-id prints the same grant while it
lasts; once it ended, the request ID is spent (exit code 3, with the reason
it ended) for the registry's request-ID window (7 days by default), also
after the grant itself is deleted. -o json|yaml|name|jsonpath|go-template
print the LockGrant.`,
		Example: `  kubectl lockwarden acquire reports/nightly --ttl 60s --wait 10s
  kubectl lockwarden acquire reports/nightly -o json
  kubectl lockwarden acquire reports/nightly -o jsonpath='{.metadata.name} {.metadata.uid} {.status.fenceToken}'

  # One of 4 permits of render/farm: at most 4 holders at once.
  kubectl lockwarden acquire render/farm --permits 4`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			printer, err := toPrinter(pf)
			if err != nil {
				return err
			}
			locks, c, ns, err := a.locks()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			p := newProgress(a.streams.ErrOut, c, ns, args[0], o.permits)
			// The grant outlives this command: it is renewed and released
			// by hand, from any process of the same user, and tied to no
			// session: it lives by its lease and its renewals.
			h, err := locks.Acquire(ctx, args[0], append(o.lockOptions(), lock.WithProgress(p.update), lock.WithDetachedGrant(), lock.WithoutSession())...)
			if err != nil {
				p.finish("")
				return classify(err)
			}
			p.finish(fmt.Sprintf("acquired %s", args[0]))
			g, err := heldGrant(ctx, h, c)
			if err != nil {
				// Nobody but this command knows the grant yet: it must
				// not outlive it.
				rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				defer cancel()
				_ = h.Release(rctx)
				return classify(err)
			}
			if printer != nil {
				return printObject(printer, g, "LockGrant", a.streams.Out)
			}
			fmt.Fprintf(a.streams.Out, "grant %s%s fence %d expires %s uid %s\n", g.Name, permitText(g), g.Status.FenceToken, timestamp(g.Status.ExpiresAt), g.UID)
			return nil
		},
	}
	o.addFlags(cmd)
	pf.AddFlags(cmd)
	return cmd
}

// heldGrant returns h's grant once its status says Held, with its fence and
// signed record: the handle may hold by the resource's fence record a
// moment before.
func heldGrant(ctx context.Context, h *lock.Handle, c client.WithWatch) (*lockingv1alpha1.LockGrant, error) {
	if _, err := h.AwaitRecord(ctx); err != nil {
		return nil, err
	}
	return lock.WaitForGrant(ctx, c, h.Info().Grant, func(g *lockingv1alpha1.LockGrant) bool { return g != nil })
}

func (a *app) renewCmd() *cobra.Command {
	var uid string
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "renew GRANT",
		Short: "Renew a grant once: its lease runs for its TTL from now",
		Long: `Renew the grant GRANT (NAME or NAMESPACE/NAME) once and wait for the
controller's answer. A grant whose lease already ran out is never renewed
(exit code 3, EXPIRED): acquire again for a new fence. A grant that
'kubectl lockwarden run' or a library handle holds is renewed by that process
only (exit code 3, DRIVER_MISMATCH). A grant that does not exist is
UNKNOWN_GRANT (exit code 3), as for release.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeGrants,
		RunE: func(cmd *cobra.Command, args []string) error {
			locks, _, ns, err := a.locks()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			ctx, cancelT := context.WithTimeout(ctx, timeout)
			defer cancelT()
			key := grantKey(args[0], ns)
			id, err := a.acquisition(ctx, key, uid)
			if err != nil {
				return classify(err)
			}
			g, err := locks.Renew(ctx, key, id)
			if err != nil {
				return classify(err)
			}
			fmt.Fprintf(a.streams.Out, "grant %s fence %d expires %s\n", g.Name, g.Status.FenceToken, timestamp(g.Status.ExpiresAt))
			return nil
		},
	}
	cmd.Flags().StringVar(&uid, "uid", "", "Renew only if the grant is this acquisition (its UID, which acquire prints). Without it, the grant that has the name now, unless it reuses a spent request ID (see release --help).")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long to wait for the controller's answer.")
	return cmd
}

func (a *app) releaseCmd() *cobra.Command {
	var uid string
	var timeout time.Duration
	var byDelete bool
	cmd := &cobra.Command{
		Use:   "release GRANT",
		Short: "Release a grant, or withdraw a waiting request",
		Long: `Release the grant GRANT (NAME or NAMESPACE/NAME): exactly this acquisition,
never a later grant. Prints "released", or exits with code 3 and the reason:
NOT_OWNER (another identity's grant), EXPIRED (the lease had run out),
ALREADY_ENDED (released before, or timed out), REVOKED, or UNKNOWN_GRANT (no
such grant or acquisition, as for renew). Releasing the grant of a running
'kubectl lockwarden run' stops it: its command is terminated.

--uid UID (acquire prints it) names the acquisition itself: the release acts
on it or on nothing, whoever has the name now. Without --uid the release acts
on the grant that has the name now, unless the registry marked that grant as
made with a request ID an earlier grant had spent (once the request ID's
window passed): whoever learned the name saw the earlier acquisition, so such
a grant is refused by name alone (UNKNOWN_GRANT) and needs its --uid.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeGrants,
		RunE: func(cmd *cobra.Command, args []string) error {
			locks, _, ns, err := a.locks()
			if err != nil {
				return err
			}
			ctx, cancel := signalContext()
			defer cancel()
			ctx, cancelT := context.WithTimeout(ctx, timeout)
			defer cancelT()
			key := grantKey(args[0], ns)
			id, err := a.acquisition(ctx, key, uid)
			if err != nil {
				return classify(err)
			}
			var opts []lock.Option
			if byDelete {
				opts = append(opts, lock.WithReleaseByDelete())
			}
			if err := locks.Release(ctx, key, id, opts...); err != nil {
				return classify(err)
			}
			fmt.Fprintf(a.streams.Out, "grant %s released\n", key.Name)
			return nil
		},
	}
	cmd.Flags().StringVar(&uid, "uid", "", "Release only if the grant is this acquisition (its UID, which acquire prints).")
	cmd.Flags().DurationVar(&timeout, "timeout", 30*time.Second, "How long to wait for an answer.")
	cmd.Flags().BoolVar(&byDelete, "delete", false, releaseByDeleteHelp)
	return cmd
}

// acquisition returns the UID of the acquisition a command acts on: uid
// when given, else the grant's that has the name now, if the caller can
// have seen it. A grant that does not exist is an UNKNOWN_GRANT refusal, for
// renew and release alike.
//
// The caller cannot have seen a grant the registry marked as made with a
// request ID that an earlier grant had spent (ReusedRequestIDAnnotation):
// whoever learned the name before learned that earlier acquisition, which
// no longer exists, and a name alone must never reach a later one. Such a
// grant is refused by name alone (UNKNOWN_GRANT, naming its UID); its UID
// acts on it.
func (a *app) acquisition(ctx context.Context, key types.NamespacedName, uid string) (types.UID, error) {
	if uid != "" {
		return types.UID(uid), nil
	}
	c, err := a.client()
	if err != nil {
		return "", err
	}
	var g lockingv1alpha1.LockGrant
	if err := c.Get(ctx, key, &g); err != nil {
		if apierrors.IsNotFound(err) {
			return "", fmt.Errorf("grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonUnknownGrant,
				Detail: "no such grant: it ended and was deleted, or never existed"})
		}
		return "", err
	}
	if ended, ok := g.Annotations[lockingv1alpha1.ReusedRequestIDAnnotation]; ok {
		return "", fmt.Errorf("grant %s: %w", key, &fencing.Error{Reason: fencing.ReasonUnknownGrant, Detail: fmt.Sprintf(
			"the name now belongs to a later acquisition (uid %s), made with request ID %q after the grant that spent it ended (%s); the acquisition a name alone can mean no longer exists. To act on the later one, pass --uid %s",
			g.UID, g.Spec.RequestID, ended, g.UID)})
	}
	return g.UID, nil
}

// progress prints a line on stderr while a request waits in the queue.
type progress struct {
	w        io.Writer
	tty      bool
	c        client.Client
	ns       string
	resource string
	// permits the request names; above 1 the line counts the holders.
	permits int32
	last    string
}

func newProgress(w io.Writer, c client.Client, ns, resource string, permits int32) *progress {
	return &progress{w: w, tty: isTerminal(w), c: c, ns: ns, resource: resource, permits: permits}
}

// permitText is " permit K (FENCED-RESOURCE)" for a grant of a resource with
// permits, "" for an exclusive lock.
func permitText(g *lockingv1alpha1.LockGrant) string {
	if g.Spec.EffectivePermits() <= 1 && (g.Status.Permit == nil || *g.Status.Permit == 0) {
		return ""
	}
	return fmt.Sprintf(" permit %d (%s)", g.HeldSlot(), g.HeldFencedResource())
}

// update is a lock.WithProgress callback.
func (p *progress) update(g *lockingv1alpha1.LockGrant) {
	if g.Status.Phase != lockingv1alpha1.PhasePending || g.Status.QueuePosition == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	// status.queuePosition is the position when the request joined (and 0
	// once it is next); the live one is counted from the queue, when the
	// user may list the namespace's grants.
	pos := *g.Status.QueuePosition
	var list lockingv1alpha1.LockGrantList
	listed := p.c.List(ctx, &list, client.InNamespace(p.ns)) == nil
	if listed {
		if live, ok := livePositions(list.Items)[g.UID]; ok {
			pos = live
		}
	}
	line := fmt.Sprintf("waiting for %s: position %d in the queue", p.resource, pos)
	if why := heldBack(g); why != "" {
		// Next in line, but the issuer's epoch has no fence for the
		// resource: only an operator can change that.
		if line += "; " + why; line != p.last {
			p.print(line)
		}
		return
	}
	var st *resourceStatus
	if listed {
		st = statusOf(p.ns, p.resource, list.Items, nil)
	}
	if p.permits > 1 || (st != nil && st.semaphore()) {
		// Each permit has its own fence record; the holders are counted
		// from the grants, when the user may list them. A request for
		// one permit waits here too while holders of a resource whose
		// limit was lowered keep their permits.
		if st != nil {
			line += fmt.Sprintf(", %d of %d permits held", len(st.Holders), st.Permits)
		}
		if line != p.last {
			p.print(line)
		}
		return
	}
	// The holder, or the lock-delay, when the user may read the resource's
	// fence record.
	var fc lockingv1alpha1.FenceCounter
	key := types.NamespacedName{Namespace: p.ns, Name: lockingv1alpha1.FenceCounterName(p.resource)}
	if err := p.c.Get(ctx, key, &fc); err == nil {
		switch {
		case fc.Spec.Holder != nil:
			line += fmt.Sprintf(", held by %s (%s, fence %d)", fc.Spec.Holder.Name, fc.Spec.Holder.Owner, fc.Spec.Holder.Fence)
		case lockDelayAhead(fc.Spec.LockDelayUntil):
			line += fmt.Sprintf(", lock-delay until %s (the last holder's lease ended without a release)", fc.Spec.LockDelayUntil)
		}
	}
	if line == p.last {
		return
	}
	p.print(line)
}

// heldBack is the message of a waiting grant that the issuer's epoch has
// no fence for (Ready reason SequenceExhausted or EpochBehind), "" for any
// other.
func heldBack(g *lockingv1alpha1.LockGrant) string {
	c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady)
	if c == nil {
		return ""
	}
	switch fencing.Reason(fencing.CodeOf(c.Reason)) {
	case fencing.ReasonSequenceExhausted, fencing.ReasonEpochBehind:
		return fencing.CodeOf(c.Reason) + ": " + c.Message
	}
	return ""
}

// print shows line as the progress line.
func (p *progress) print(line string) {
	p.last = line
	if p.tty {
		fmt.Fprintf(p.w, "\r\033[Kkubectl-lockwarden: %s", line)
	} else {
		fmt.Fprintf(p.w, "kubectl-lockwarden: %s\n", line)
	}
}

// finish ends the progress line, printing msg if anything was printed.
func (p *progress) finish(msg string) {
	if p.last == "" {
		return
	}
	if p.tty {
		fmt.Fprint(p.w, "\r\033[K")
	}
	if msg != "" {
		fmt.Fprintf(p.w, "kubectl-lockwarden: %s\n", msg)
	}
}

// lockDelayAhead reports whether a counter's lockDelayUntil lies ahead, by
// the local clock (for display only).
func lockDelayAhead(until string) bool {
	t, err := time.Parse(time.RFC3339Nano, until)
	return err == nil && time.Until(t) > 0
}
