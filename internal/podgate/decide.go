package podgate

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
)

// Heartbeat is what the manager knows of the heartbeat of a Pod's node
// (its Lease in kube-node-lease), judged like a client session: by the
// manager's own observations of the Lease changing, never by a time the
// kubelet wrote (fencing.CheckSession).
type Heartbeat int

const (
	// HeartbeatUnknown means the heartbeat was not read: the decision does
	// not need it (NodeReadNeeded), or the Pod is not on a node yet.
	HeartbeatUnknown Heartbeat = iota
	// HeartbeatLive means the node renewed its Lease within the Lease's
	// duration.
	HeartbeatLive
	// HeartbeatLapsed means the node's Lease is gone or was not renewed
	// within its duration: the node is presumed lost.
	HeartbeatLapsed
)

// Facts are what Decide needs about one Pod name.
type Facts struct {
	// Now is the manager's clock, the one every lease is judged by.
	Now time.Time
	// Pod is the Pod; nil when no Pod of that name exists (a direct read
	// confirmed it).
	Pod *corev1.Pod
	// Request is the Pod's parsed lock request; RequestErr is set when its
	// annotations do not parse (only read when a grant must be requested).
	Request    Request
	RequestErr error
	// Grants are the grants requested for Pods of this name in its
	// namespace: the Pod's own (its controller reference has the Pod's
	// UID) and those of earlier Pods of the same name.
	Grants []*lockingv1alpha1.LockGrant
	// Node is the heartbeat of the Pod's node, when NodeReadNeeded.
	Node Heartbeat
	// Ahead are the gated Pods of the same lock in the namespace that were
	// admitted before the Pod and have no grant yet, gathered only when
	// the Pod's grant is to be requested: their grants are requested
	// first, so that grants reach the queue in the order their Pods were
	// admitted.
	Ahead []*corev1.Pod
}

// Plan is what the manager does for one Pod, in this order: release the
// grants in Release, create Requests, remove the gate with Start, renew
// Renew, end the Pod with End. Events are sent once the write they
// announce succeeded.
type Plan struct {
	// Release are grants to release (Held) or withdraw (Pending), as their
	// steward: grants of Pods that are gone, and the Pod's own grant once it
	// finished or is deleted before it started.
	Release []*lockingv1alpha1.LockGrant
	// Requests are the grants to request, in this order: those of the
	// Pods ahead of the Pod that have none yet, then the Pod's own.
	Requests []*lockingv1alpha1.LockGrant
	// Start, when set, is the one write that lets the Pod start: the
	// annotations to set, and the scheduling gate to remove, with a
	// precondition on the Pod's resourceVersion.
	Start map[string]string
	// Renew is the grant to renew (its spec.renewals raised by one).
	Renew *lockingv1alpha1.LockGrant
	// End, when set, deletes the Pod: its grant ended while it may run.
	End *End
	// Events are the Pod's Events.
	Events []Event
	// RequeueAfter is when to decide again without a change (the next
	// renewal, the lease's end); 0 for no deadline.
	RequeueAfter time.Duration
}

// End is why a Pod is ended: an Event and DisruptionTarget reason, and a
// sentence for the user.
type End struct {
	Reason, Message string
}

// Event is one Event about the Pod, related to Grant when set.
type Event struct {
	Type, Reason, Note string
	Grant              *lockingv1alpha1.LockGrant
}

// Decide plans what the manager does next for one Pod name. It does no
// I/O.
func Decide(f Facts) Plan {
	var p Plan
	var mine *lockingv1alpha1.LockGrant
	for _, g := range f.Grants {
		if ref := PodOf(g); f.Pod != nil && ref != nil && ref.UID == string(f.Pod.UID) {
			mine = g
			continue
		}
		// The grant of a Pod that is gone, deleted or replaced by another
		// of the same name: it gives the lock back.
		if live(g) {
			p.Release = append(p.Release, g)
		}
	}
	pod := f.Pod
	if pod == nil {
		return p
	}
	finished := Finished(pod)
	deleting := pod.DeletionTimestamp != nil
	gated := Gated(pod)
	switch {
	case mine == nil:
		switch {
		case finished || deleting:
		case !gated && pod.Annotations[lockingv1alpha1.GrantUIDAnnotation] != "":
			p.End = &End{Reason: lockingv1alpha1.GatedPodReasonLockLost, Message: fmt.Sprintf("grant %s of lock %s no longer exists (it was deleted)",
				pod.Annotations[lockingv1alpha1.GrantAnnotation], pod.Annotations[lockingv1alpha1.LockAnnotation])}
		case !gated:
			p.End = &End{Reason: lockingv1alpha1.GatedPodReasonGateRemoved, Message: fmt.Sprintf("the scheduling gate %s was removed before lock %s was granted",
				lockingv1alpha1.PodSchedulingGate, pod.Annotations[lockingv1alpha1.LockAnnotation])}
		case f.RequestErr != nil:
			p.Events = append(p.Events, Event{Type: corev1.EventTypeWarning, Reason: lockingv1alpha1.GatedPodReasonInvalidRequest,
				Note: fmt.Sprintf("the Pod waits and requests no lock: %v", f.RequestErr)})
		default:
			for _, a := range f.Ahead {
				if r, errs := ParseRequest(a.Annotations); len(errs) == 0 && waitsForRequest(a) && r.Resource == f.Request.Resource {
					p.Requests = append(p.Requests, GrantFor(a, r))
				}
			}
			p.Requests = append(p.Requests, GrantFor(pod, f.Request))
		}
	case mine.Status.Phase.Final():
		if finished || deleting {
			break
		}
		if gated {
			p.End = &End{Reason: lockingv1alpha1.GatedPodReasonRequestEnded, Message: fmt.Sprintf("grant %s of lock %s ended as %s before it was granted%s",
				mine.Name, mine.Spec.Resource, mine.Status.Phase, readyReason(mine))}
			break
		}
		p.End = &End{Reason: lockingv1alpha1.GatedPodReasonLockLost, Message: fmt.Sprintf("grant %s of lock %s (fence %d) ended as %s%s: writes under its fence are refused",
			mine.Name, mine.Spec.Resource, mine.Status.FenceToken, mine.Status.Phase, readyReason(mine))}
	case mine.Spec.Release:
		// Released by its steward or owner: it ends next.
	case mine.Status.Phase != lockingv1alpha1.PhaseHeld:
		switch {
		case finished || deleting:
			p.Release = append(p.Release, mine)
		case !gated:
			p.Release = append(p.Release, mine)
			p.End = &End{Reason: lockingv1alpha1.GatedPodReasonGateRemoved, Message: fmt.Sprintf("the scheduling gate %s was removed before lock %s was granted",
				lockingv1alpha1.PodSchedulingGate, mine.Spec.Resource)}
		}
	case finished || (deleting && gated):
		p.Release = append(p.Release, mine)
	case gated:
		p.Start = StartAnnotations(mine)
		p.Events = append(p.Events, Event{Type: corev1.EventTypeNormal, Reason: lockingv1alpha1.GatedPodReasonGranted, Grant: mine,
			Note: fmt.Sprintf("lock %s granted with fence %d (grant %s): the Pod may start", mine.HeldFencedResource(), mine.Status.FenceToken, mine.Name)})
	case pod.Annotations[lockingv1alpha1.GrantUIDAnnotation] != string(mine.UID) && !deleting:
		// The gate is gone, but not by the write that put this grant's
		// fence on the Pod (or its annotations were changed since, which
		// whoever may patch the Pod can do): its containers may run. It is
		// ended, and keeps the lease until it is gone, as any Pod being
		// deleted: the lock is not given back while they may still run.
		p.End = &End{Reason: lockingv1alpha1.GatedPodReasonGateRemoved, Message: fmt.Sprintf("the scheduling gate %s was removed before lock %s was granted",
			lockingv1alpha1.PodSchedulingGate, mine.Spec.Resource)}
	default:
		renew(&p, f, mine)
	}
	return p
}

// Confirm reports whether plan p, decided on facts f as the caches show
// them, must be decided again on the API server's versions before it is
// applied: it ends the Pod, or it releases the grant of another Pod of
// the same name. The Pod cache and the grant cache are not in step: the
// Pod cache can be ahead (the Pod another replica just started, its grant
// still Pending in the grant cache, which looks like a gate removed by
// hand) or behind (an earlier Pod of the name, being deleted, while the
// grant cache already shows the Held grant of the Pod that replaced it,
// which looks like the grant of a Pod that is gone). A Pod the caches do
// not show was read from the API server already.
func Confirm(f Facts, p Plan) bool {
	if p.End != nil {
		return true
	}
	if f.Pod == nil {
		return false
	}
	for _, g := range p.Release {
		if ref := PodOf(g); ref == nil || ref.UID != string(f.Pod.UID) {
			return true
		}
	}
	return false
}

// Finished reports whether no container of pod runs or will run again:
// its phase is Succeeded or Failed, or it restarts no container (its
// restartPolicy is Never, no container overrides it and none has restart
// rules, which may restart every container in place) and the kubelet
// reports every regular container terminated and no container (init,
// sidecar or ephemeral) running or waiting to start. The kubelet reports
// the containers terminated a while before the phase: it writes the phase
// only once it has torn the Pod's sandbox down, which on a busy node takes
// a second or more of every handoff.
func Finished(pod *corev1.Pod) bool {
	if pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		return true
	}
	if pod.Spec.RestartPolicy != corev1.RestartPolicyNever || pod.Status.Phase != corev1.PodRunning ||
		len(pod.Spec.Containers) == 0 || len(pod.Status.ContainerStatuses) != len(pod.Spec.Containers) ||
		len(pod.Status.EphemeralContainerStatuses) != len(pod.Spec.EphemeralContainers) {
		return false
	}
	for _, c := range pod.Spec.Containers {
		if c.RestartPolicy != nil || len(c.RestartPolicyRules) > 0 {
			return false
		}
	}
	// A container's restart rules may restart every container of the Pod
	// in place (RestartAllContainers), a sidecar's too when it exits after
	// the regular containers did: only the phase says the Pod is over.
	for _, c := range pod.Spec.InitContainers {
		if len(c.RestartPolicyRules) > 0 {
			return false
		}
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.AllContainersRestarting && c.Status == corev1.ConditionTrue {
			return false
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Terminated == nil {
			return false
		}
	}
	for _, list := range [][]corev1.ContainerStatus{pod.Status.InitContainerStatuses, pod.Status.EphemeralContainerStatuses} {
		for _, cs := range list {
			if cs.State.Running != nil || cs.State.Waiting != nil {
				return false
			}
		}
	}
	return true
}

// waitsForRequest reports whether a Pod still waits for its grant to be
// requested: gated, not finished, not being deleted.
func waitsForRequest(p *corev1.Pod) bool {
	return Gated(p) && p.DeletionTimestamp == nil && p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// AdmittedBefore reports whether Pod a was admitted before Pod b: by their
// admission stamps (RequestedAtAnnotation), then UIDs.
func AdmittedBefore(a, b *corev1.Pod) bool {
	ta, erra := time.Parse(time.RFC3339Nano, a.Annotations[lockingv1alpha1.RequestedAtAnnotation])
	tb, errb := time.Parse(time.RFC3339Nano, b.Annotations[lockingv1alpha1.RequestedAtAnnotation])
	if erra != nil || errb != nil || ta.Equal(tb) {
		return a.UID < b.UID
	}
	return ta.Before(tb)
}

// renew plans the renewal of a running Pod's Held grant: a third of its
// lease after it was granted or last renewed, unless a renewal is still
// unanswered, and only while the Pod's node is alive (or the Pod is not on
// a node yet) and none of its started containers is not ready.
func renew(p *Plan, f Facts, g *lockingv1alpha1.LockGrant) {
	if g.Status.ExpiresAt == nil || !f.Now.Before(g.Status.ExpiresAt.Time) {
		return // over: the grant controller ends it next
	}
	end := g.Status.ExpiresAt.Time
	if !RenewDue(g, f.Now) {
		p.RequeueAfter = max(renewAt(g).Sub(f.Now), time.Millisecond)
		if g.Spec.Renewals > g.Status.ObservedRenewals {
			p.RequeueAfter = end.Sub(f.Now)
		}
		return
	}
	if f.Pod.Spec.NodeName != "" && f.Node != HeartbeatLive {
		p.Events = append(p.Events, Event{Type: corev1.EventTypeWarning, Reason: lockingv1alpha1.GatedPodReasonNodeLost, Grant: g,
			Note: fmt.Sprintf("node %s's heartbeat lapsed: grant %s is not renewed and ends at %s; the Pod is then deleted",
				f.Pod.Spec.NodeName, g.Name, end.UTC().Format(time.RFC3339))})
		p.RequeueAfter = end.Sub(f.Now)
		return
	}
	if c := NotReady(f.Pod); c != "" {
		p.Events = append(p.Events, Event{Type: corev1.EventTypeWarning, Reason: lockingv1alpha1.GatedPodReasonNotReady, Grant: g,
			Note: fmt.Sprintf("container %s is not ready: grant %s is not renewed while it stays so, and ends at %s; the Pod is then deleted",
				c, g.Name, end.UTC().Format(time.RFC3339))})
		p.RequeueAfter = end.Sub(f.Now)
		return
	}
	p.Renew = g
	p.RequeueAfter = end.Sub(f.Now)
}

// NotReady names a container of pod that has started and runs but is not
// ready: its readiness probe fails. A container that is still starting
// (pulling its image, or before its startup probe passed) is not judged,
// and one without a readiness probe is ready as soon as it runs. "" when
// there is none.
func NotReady(pod *corev1.Pod) string {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Running != nil && cs.Started != nil && *cs.Started && !cs.Ready {
			return cs.Name
		}
	}
	return ""
}

// renewAt is when a Held grant is next renewed: when two thirds of its
// lease remain.
func renewAt(g *lockingv1alpha1.LockGrant) time.Time {
	ttl := time.Duration(g.Spec.LeaseDurationSeconds) * time.Second
	return g.Status.ExpiresAt.Add(-2 * ttl / 3)
}

// RenewDue reports whether a Held grant is due for renewal at now: a third
// of its lease has passed, and no renewal is unanswered.
func RenewDue(g *lockingv1alpha1.LockGrant, now time.Time) bool {
	return g.Status.Phase == lockingv1alpha1.PhaseHeld && g.Status.ExpiresAt != nil &&
		g.Spec.Renewals <= g.Status.ObservedRenewals && !now.Before(renewAt(g))
}

// NodeReadNeeded reports whether Decide needs the heartbeat of the Pod's
// node: the Pod runs on a node with a Held grant due for renewal. Renewals
// are a third of a lease apart, so a holder costs one read of its node's
// Lease per renewal, and a waiter none.
func NodeReadNeeded(f Facts) bool {
	if f.Pod == nil || f.Pod.Spec.NodeName == "" || Gated(f.Pod) {
		return false
	}
	for _, g := range f.Grants {
		if ref := PodOf(g); ref != nil && ref.UID == string(f.Pod.UID) && !g.Spec.Release && RenewDue(g, f.Now) {
			return true
		}
	}
	return false
}

// StartAnnotations are the annotations the write that starts a Pod puts on
// it for its Held grant g: the grant's name, UID, fence, proof and the
// fenced resource ID of its slot.
func StartAnnotations(g *lockingv1alpha1.LockGrant) map[string]string {
	a := map[string]string{
		lockingv1alpha1.GrantAnnotation:          g.Name,
		lockingv1alpha1.GrantUIDAnnotation:       string(g.UID),
		lockingv1alpha1.FenceAnnotation:          strconv.FormatInt(g.Status.FenceToken, 10),
		lockingv1alpha1.FencedResourceAnnotation: g.HeldFencedResource(),
	}
	if g.Status.Proof != "" {
		a[lockingv1alpha1.ProofAnnotation] = g.Status.Proof
	}
	return a
}

// live reports whether a grant may still hold or be granted, and nobody
// asked to release it yet.
func live(g *lockingv1alpha1.LockGrant) bool {
	return !g.Status.Phase.Final() && !g.Spec.Release
}

// readyReason is the grant's Ready condition, ": REASON: message", or "".
func readyReason(g *lockingv1alpha1.LockGrant) string {
	if c := meta.FindStatusCondition(g.Status.Conditions, lockingv1alpha1.ConditionReady); c != nil && c.Reason != "" {
		return fmt.Sprintf(" (%s: %s)", c.Reason, c.Message)
	}
	return ""
}

// WaitingNote says why grant g, just requested, waits: who holds its
// resource and how many requests are ahead of it, from the resource's
// grants as known (g among them or not).
func WaitingNote(g *lockingv1alpha1.LockGrant, grants []lockingv1alpha1.LockGrant) string {
	var holders []string
	ahead := 0
	for i := range grants {
		o := &grants[i]
		if o.UID == g.UID || o.Name == g.Name || o.Spec.Resource != g.Spec.Resource || !live(o) {
			continue
		}
		switch o.Status.Phase {
		case lockingv1alpha1.PhaseHeld:
			who := o.Spec.Owner
			if ref := PodOf(o); ref != nil {
				who = "Pod " + ref.Name
			}
			holders = append(holders, fmt.Sprintf("%s (fence %d)", who, o.Status.FenceToken))
		default:
			if grantplan.FIFO(*o, *g) < 0 {
				ahead++
			}
		}
	}
	held := "no holder"
	if len(holders) > 0 {
		held = "held by " + strings.Join(holders, ", ")
	}
	return fmt.Sprintf("waiting for lock %s (grant %s): %s, %d request(s) ahead", g.Spec.Resource, g.Name, held, ahead)
}
