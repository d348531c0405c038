package main

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/cli-runtime/pkg/printers"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/podgate"
)

// resourceStatus is what `kubectl lockwarden status` reports about one resource.
type resourceStatus struct {
	Resource  string `json:"resource"`
	Namespace string `json:"namespace"`
	// Permits is the number of holders the resource admits at once: the
	// permits of its most recently requested live grant (1 when it has
	// none, or for an exclusive lock).
	Permits int32 `json:"permits"`
	// Holder is the Held grant of slot 0, the resource ID itself: the
	// holder of an exclusive lock.
	Holder *holderStatus `json:"holder,omitempty"`
	// Holders are every Held grant, by permit: one at most for an
	// exclusive lock, up to Permits (more after the limit was lowered)
	// for a resource with permits.
	Holders []holderStatus `json:"holders"`
	// HighestFence is the highest fence ever issued for slot 0, the
	// resource ID itself (from its FenceCounter); 0 when unknown. Each
	// other slot has its own fence sequence: see its holder's fence.
	HighestFence int64 `json:"highestFence,omitempty"`
	// SlotFences are, for a resource with permits, the highest fence ever
	// issued for each permit below the limit or held: each permit has a
	// fence sequence of its own.
	SlotFences []slotFence `json:"slotFences,omitempty"`
	// LockDelayUntil is set while slot 0 waits out the lock-delay of a
	// holder whose lease ended without a release: nobody is granted it
	// before, by the controller's clock.
	LockDelayUntil *metav1.Time `json:"lockDelayUntil,omitempty"`
	// Queue are the waiting requests, next first.
	Queue []queuedRequest `json:"queue"`
}

type holderStatus struct {
	Grant string    `json:"grant"`
	UID   types.UID `json:"uid"`
	Owner string    `json:"owner"`
	// Permit is the slot the grant holds, and FencedResource that slot's
	// fenced resource ID, which its fence belongs to and its guarded
	// writes name.
	Permit         int32  `json:"permit"`
	FencedResource string `json:"fencedResource"`
	Fence          int64  `json:"fence"`
	// OverLimit is set on a holder beyond the limit after it was lowered:
	// it keeps its slot until it ends.
	OverLimit bool              `json:"overLimit,omitempty"`
	GrantedAt *metav1.MicroTime `json:"grantedAt,omitempty"`
	ExpiresAt *metav1.MicroTime `json:"expiresAt,omitempty"`
	Renewals  int64             `json:"renewals"`
	// Pod is the lock-gated Pod the grant was requested for, if any.
	Pod string `json:"pod,omitempty"`
}

// slotFence is the highest fence issued for one permit.
type slotFence struct {
	Permit         int32  `json:"permit"`
	FencedResource string `json:"fencedResource"`
	HighestFence   int64  `json:"highestFence"`
}

type queuedRequest struct {
	Position    int32  `json:"position"`
	Grant       string `json:"grant"`
	Owner       string `json:"owner"`
	RequestedAt string `json:"requestedAt,omitempty"`
	// Permits is the number of permits the request names.
	Permits int32 `json:"permits"`
	// WaitTimeoutSeconds is the request's wait limit, in seconds; 0 none.
	WaitTimeoutSeconds int32 `json:"waitTimeoutSeconds,omitempty"`
	// Pod is the lock-gated Pod the request was made for, if any.
	Pod string `json:"pod,omitempty"`
}

func (a *app) statusCmd() *cobra.Command {
	// A resource's status is not an API object: no -o name.
	pf := printFlags(false)
	cmd := &cobra.Command{
		Use:   "status RESOURCE",
		Short: "Show who holds RESOURCE, with which fence until when, and who waits",
		Long: `Show the holder of RESOURCE (grant, owner, fence, expiry by the controller's
clock), the highest fence ever issued for it, and the queue of waiting
requests, next first; for a lock-gated Pod's grant, the Pod too. For a resource with permits (acquire or run
--permits N) it shows the limit in force and every holder with its permit,
its fenced resource ID and its fence (each permit has its own fence
sequence). -o json|yaml|jsonpath|go-template print it as an object of kind
ResourceStatus.`,
		Example: `  kubectl lockwarden status db/orders
  kubectl lockwarden status db/orders -o jsonpath='{.holder.fence}'
  kubectl lockwarden status render/farm -o jsonpath='{range .holders[*]}{.permit} {.fence}{"\n"}{end}'`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeResources,
		RunE: func(cmd *cobra.Command, args []string) error {
			printer, err := toPrinter(pf)
			if err != nil {
				return err
			}
			c, err := a.client()
			if err != nil {
				return err
			}
			ns, err := a.namespace()
			if err != nil {
				return err
			}
			st, err := readStatus(cmd.Context(), c, ns, args[0])
			if err != nil {
				return err
			}
			if printer != nil {
				return printObject(printer, st, "ResourceStatus", a.streams.Out)
			}
			printStatus(a, st)
			return nil
		},
	}
	pf.AddFlags(cmd)
	return cmd
}

func readStatus(ctx context.Context, c client.Client, ns, resource string) (*resourceStatus, error) {
	if !lockingv1alpha1.ValidResourceID(resource) {
		return nil, fmt.Errorf("%q is not a resource ID (%s, at most %d bytes)", resource, lockingv1alpha1.ResourcePattern, lockingv1alpha1.MaxResourceLength)
	}
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	var list lockingv1alpha1.LockGrantList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	var fc *lockingv1alpha1.FenceCounter
	counter := &lockingv1alpha1.FenceCounter{}
	switch err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(resource)}, counter); {
	case err == nil:
		fc = counter
	case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
	default:
		return nil, err
	}
	st := statusOf(ns, resource, list.Items, fc)
	if st.semaphore() {
		counters := map[int32]*lockingv1alpha1.FenceCounter{0: fc}
		for k := int32(1); k < st.slots(); k++ {
			sc := &lockingv1alpha1.FenceCounter{}
			switch err := c.Get(ctx, types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.FenceCounterName(lockingv1alpha1.SlotResource(resource, k))}, sc); {
			case err == nil:
				counters[k] = sc
			case apierrors.IsNotFound(err), apierrors.IsForbidden(err):
			default:
				return nil, err
			}
		}
		st.addSlotFences(counters)
	}
	return st, nil
}

// slots is the number of permits to show: those below the limit, and any
// permit held above it.
func (st *resourceStatus) slots() int32 {
	n := st.Permits
	for _, h := range st.Holders {
		n = max(n, h.Permit+1)
	}
	return min(n, lockingv1alpha1.MaxPermits)
}

// addSlotFences fills SlotFences from the permits' FenceCounters (nil or
// missing when unknown) and the holders' fences.
func (st *resourceStatus) addSlotFences(counters map[int32]*lockingv1alpha1.FenceCounter) {
	st.SlotFences = nil
	for k := int32(0); k < st.slots(); k++ {
		f := slotFence{Permit: k, FencedResource: lockingv1alpha1.SlotResource(st.Resource, k)}
		if c := counters[k]; c != nil {
			f.HighestFence = c.Spec.Fence
		}
		if k == 0 {
			f.HighestFence = max(f.HighestFence, st.HighestFence)
		}
		for _, h := range st.Holders {
			if h.Permit == k {
				f.HighestFence = max(f.HighestFence, h.Fence)
			}
		}
		st.SlotFences = append(st.SlotFences, f)
	}
}

// statusOf is the status of resource in namespace ns, from the
// namespace's grants and slot 0's FenceCounter (nil when unknown).
func statusOf(ns, resource string, grants []lockingv1alpha1.LockGrant, fc *lockingv1alpha1.FenceCounter) *resourceStatus {
	st := &resourceStatus{Resource: resource, Namespace: ns, Holders: []holderStatus{}, Queue: []queuedRequest{}}
	live := livePositions(grants)
	var holding, waiting []*lockingv1alpha1.LockGrant
	for i := range grants {
		g := &grants[i]
		if g.Namespace != ns || g.Spec.Resource != resource {
			continue
		}
		permit, fenced := g.HeldSlot(), g.HeldFencedResource()
		switch g.Status.Phase {
		case lockingv1alpha1.PhaseHeld:
			holding = append(holding, g)
			st.Holders = append(st.Holders, holderStatus{Grant: g.Name, UID: g.UID, Owner: g.Spec.Owner,
				Permit: permit, FencedResource: fenced, Fence: g.Status.FenceToken,
				OverLimit: meta.IsStatusConditionFalse(g.Status.Conditions, lockingv1alpha1.ConditionWithinLimit),
				GrantedAt: g.Status.GrantedAt, ExpiresAt: g.Status.ExpiresAt, Renewals: g.Status.ObservedRenewals, Pod: podOf(g)})
		case lockingv1alpha1.PhasePending:
			if g.Spec.Release {
				continue // withdrawn; the controller ends it next
			}
			waiting = append(waiting, g)
			st.Queue = append(st.Queue, queuedRequest{Position: live[g.UID], Grant: g.Name, Owner: g.Spec.Owner,
				RequestedAt: g.Annotations[lockingv1alpha1.RequestedAtAnnotation], Permits: g.Spec.EffectivePermits(),
				WaitTimeoutSeconds: g.Spec.WaitTimeoutSeconds, Pod: podOf(g)})
			continue
		}
		if permit == 0 {
			st.HighestFence = max(st.HighestFence, g.Status.FenceToken)
		}
	}
	st.Permits = grantplan.Limit(holding, waiting)
	slices.SortFunc(st.Holders, func(x, y holderStatus) int { return cmp.Compare(x.Permit, y.Permit) })
	for i := range st.Holders {
		if st.Holders[i].Permit == 0 {
			st.Holder = &st.Holders[i]
		}
	}
	slices.SortFunc(st.Queue, func(x, y queuedRequest) int { return cmp.Compare(x.Position, y.Position) })
	if fc != nil {
		st.HighestFence = max(st.HighestFence, fc.Spec.Fence)
		if t, err := time.Parse(time.RFC3339Nano, fc.Spec.LockDelayUntil); err == nil && fc.Spec.Holder == nil {
			st.LockDelayUntil = &metav1.Time{Time: t}
		}
	}
	return st
}

// semaphore reports whether st is to be shown as a resource with permits:
// a limit above 1, or a holder of a slot other than 0.
func (st *resourceStatus) semaphore() bool {
	return st.Permits > 1 || len(st.Holders) > 1 || (len(st.Holders) == 1 && st.Holders[0].Permit != 0)
}

func printStatus(a *app, st *resourceStatus) {
	w := printers.GetNewTabWriter(a.streams.Out)
	defer w.Flush()
	fmt.Fprintf(w, "Resource:\t%s (namespace %s)\n", st.Resource, st.Namespace)
	expires := func(h *holderStatus) string {
		exp := timestamp(h.ExpiresAt)
		if h.ExpiresAt != nil {
			exp += " (" + relative(h.ExpiresAt.Time) + ", by the controller's clock)"
		}
		return exp
	}
	switch h := st.Holder; {
	case st.semaphore():
		fmt.Fprintf(w, "Permits:\t%d (%d held)\n", st.Permits, len(st.Holders))
		fmt.Fprintf(w, "Holders:\t%d\n", len(st.Holders))
		// The holders' table is aligned on its own columns.
		_ = w.Flush()
		if len(st.Holders) > 0 {
			tw := printers.GetNewTabWriter(a.streams.Out)
			fmt.Fprintf(tw, "  PERMIT\tFENCED RESOURCE\tGRANT\tOWNER\tPOD\tFENCE\tEXPIRES\n")
			for i := range st.Holders {
				h := &st.Holders[i]
				permit := fmt.Sprint(h.Permit)
				if h.OverLimit {
					permit += " (over the limit)"
				}
				fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%d\t%s\n", permit, h.FencedResource, h.Grant, h.Owner, orDash(h.Pod), h.Fence, expires(h))
			}
			_ = tw.Flush()
		}
	case h != nil:
		fmt.Fprintf(w, "Holder:\t%s (owner %s)\n", h.Grant, h.Owner)
		if h.Pod != "" {
			fmt.Fprintf(w, "Pod:\t%s\n", h.Pod)
		}
		fmt.Fprintf(w, "Fence:\t%d\n", h.Fence)
		fmt.Fprintf(w, "Expires:\t%s\n", expires(h))
		fmt.Fprintf(w, "Renewals:\t%d\n", h.Renewals)
	default:
		fmt.Fprintf(w, "Holder:\t<none>\n")
	}
	switch {
	case len(st.SlotFences) > 0:
		fences := make([]string, 0, len(st.SlotFences))
		for _, f := range st.SlotFences {
			fences = append(fences, fmt.Sprintf("permit %d: %d", f.Permit, f.HighestFence))
		}
		fmt.Fprintf(w, "Highest fences:\t%s\n", strings.Join(fences, ", "))
	case st.HighestFence > 0 && st.semaphore():
		fmt.Fprintf(w, "Highest fence of permit 0:\t%d\n", st.HighestFence)
	case st.HighestFence > 0:
		fmt.Fprintf(w, "Highest fence:\t%d\n", st.HighestFence)
	}
	if d := st.LockDelayUntil; d != nil && time.Until(d.Time) > -time.Minute {
		fmt.Fprintf(w, "Lock-delay:\tuntil %s (%s, by the controller's clock): the last holder's lease ended without a release\n", d.UTC().Format(time.RFC3339Nano), relative(d.Time))
	}
	fmt.Fprintf(w, "Queue:\t%d waiting\n", len(st.Queue))
	if len(st.Queue) == 0 {
		return
	}
	// The queue's table is aligned on its own columns.
	_ = w.Flush()
	tw := printers.GetNewTabWriter(a.streams.Out)
	defer tw.Flush()
	fmt.Fprintf(tw, "  POSITION\tGRANT\tOWNER\tPOD\tREQUESTED AT\n")
	for _, q := range st.Queue {
		fmt.Fprintf(tw, "  %d\t%s\t%s\t%s\t%s\n", q.Position, q.Grant, q.Owner, orDash(q.Pod), q.RequestedAt)
	}
}

// podOf is the name of the lock-gated Pod grant g was requested for, or "".
func podOf(g *lockingv1alpha1.LockGrant) string {
	if ref := podgate.PodOf(g); ref != nil {
		return ref.Name
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// relative says "in 4s" or "3s ago", by the local clock: for display only.
func relative(t time.Time) string {
	d := time.Until(t)
	if d >= 0 {
		return "in " + duration.HumanDuration(d)
	}
	return duration.HumanDuration(-d) + " ago"
}

func (a *app) listCmd() *cobra.Command {
	var (
		resource, phase, owner, selector string
		all                              bool
	)
	pf := printFlags(true)
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List grants, filtered by resource, phase or owner",
		Example: `  kubectl lockwarden list --phase Held
  kubectl lockwarden list --resource db/orders -A
  kubectl lockwarden list --owner system:serviceaccount:billing:settlement -o yaml
  kubectl lockwarden list -o name
  kubectl lockwarden list -o jsonpath='{range .items[*]}{.metadata.name} {.status.fenceToken}{"\n"}{end}'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if phase != "" && !slices.ContainsFunc(phaseNames(), func(p string) bool { return strings.EqualFold(p, phase) }) {
				return fmt.Errorf("--phase %q is not a phase: %s", phase, phaseList())
			}
			printer, err := toPrinter(pf)
			if err != nil {
				return err
			}
			var opts []client.ListOption
			if selector != "" {
				sel, err := labels.Parse(selector)
				if err != nil {
					return err
				}
				opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
			}
			items, err := a.listGrants(all, opts...)
			if err != nil {
				return err
			}
			// Live queue positions count every waiter of a resource, not
			// only those the filters keep.
			queues := items
			if selector != "" {
				if queues, err = a.listGrants(all); err != nil {
					return err
				}
			}
			live := livePositions(queues)
			list := &lockingv1alpha1.LockGrantList{}
			for _, g := range items {
				if (resource == "" || g.Spec.Resource == resource) &&
					(phase == "" || strings.EqualFold(string(g.Status.Phase), phase)) &&
					(owner == "" || g.Spec.Owner == owner) {
					list.Items = append(list.Items, g)
				}
			}
			if printer != nil {
				return printGrants(printer, *pf.OutputFormat == "name", list, a.streams.Out)
			}
			printList(a, list.Items, live, all)
			return nil
		},
	}
	cmd.Flags().StringVar(&resource, "resource", "", "Only grants for this resource ID.")
	cmd.Flags().StringVar(&phase, "phase", "", "Only grants in this phase: "+phaseList()+".")
	cmd.Flags().StringVar(&owner, "owner", "", "Only grants of this owner identity.")
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "Label selector.")
	cmd.Flags().BoolVarP(&all, "all-namespaces", "A", false, "List grants of every namespace.")
	pf.AddFlags(cmd)
	_ = cmd.RegisterFlagCompletionFunc("phase", cobra.FixedCompletions(phaseNames(), cobra.ShellCompDirectiveNoFileComp))
	return cmd
}

// phaseNames are the phases of a LockGrant, as --phase takes them.
func phaseNames() []string {
	var names []string
	for _, p := range lockingv1alpha1.LockGrantPhases() {
		names = append(names, string(p))
	}
	return names
}

// phaseList is phaseNames in words: "Pending, Held, ... or Revoked".
func phaseList() string {
	n := phaseNames()
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

// printGrants prints list with p: as a LockGrantList, or with byName (-o
// name) one line per grant, as kubectl get -o name.
func printGrants(p printers.ResourcePrinter, byName bool, list *lockingv1alpha1.LockGrantList, w io.Writer) error {
	if !byName {
		return printObject(p, list, "LockGrantList", w)
	}
	for i := range list.Items {
		if err := printObject(p, &list.Items[i], "LockGrant", w); err != nil {
			return err
		}
	}
	return nil
}

func printList(a *app, items []lockingv1alpha1.LockGrant, live map[types.UID]int32, all bool) {
	if len(items) == 0 {
		fmt.Fprintln(a.streams.ErrOut, "No grants found.")
		return
	}
	w := printers.GetNewTabWriter(a.streams.Out)
	defer w.Flush()
	if all {
		fmt.Fprint(w, "NAMESPACE\t")
	}
	fmt.Fprintln(w, "NAME\tRESOURCE\tPHASE\tPERMIT\tFENCE\tOWNER\tEXPIRES\tQUEUE\tAGE")
	for _, g := range items {
		if all {
			fmt.Fprintf(w, "%s\t", g.Namespace)
		}
		queue := "-"
		if pos, ok := live[g.UID]; ok {
			queue = fmt.Sprint(pos)
		}
		// PERMIT: the slot held, of the permits requested; "-" for an
		// exclusive lock and for a grant that was never Held.
		permit := "-"
		if g.Status.Permit != nil && (g.Spec.EffectivePermits() > 1 || *g.Status.Permit > 0) {
			permit = fmt.Sprintf("%d/%d", *g.Status.Permit, g.Spec.EffectivePermits())
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%s\n", g.Name, g.Spec.Resource, g.Status.Phase, permit, g.Status.FenceToken,
			g.Spec.Owner, timestamp(g.Status.ExpiresAt), queue, duration.HumanDuration(time.Since(g.CreationTimestamp.Time)))
	}
}

// livePositions is every Pending request's position in its resource's
// queue, computed from the grants listed in the order the controller serves
// them (status.queuePosition is written only when a request joins the queue
// and when it becomes next).
func livePositions(items []lockingv1alpha1.LockGrant) map[types.UID]int32 {
	queues := map[types.NamespacedName][]lockingv1alpha1.LockGrant{}
	for _, g := range items {
		if g.Status.Phase == lockingv1alpha1.PhasePending && !g.Spec.Release {
			k := types.NamespacedName{Namespace: g.Namespace, Name: g.Spec.Resource}
			queues[k] = append(queues[k], g)
		}
	}
	out := map[types.UID]int32{}
	for _, q := range queues {
		slices.SortFunc(q, grantplan.FIFO)
		for i, g := range q {
			out[g.UID] = int32(i)
		}
	}
	return out
}
