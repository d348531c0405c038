package sim

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/podgate"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// FaultGatedPod runs lock-gated Pods (docs/gated-workloads.md) beside the
// workers, in the resource's queue: the manager's decisions are
// internal/podgate.Decide, its grants are admitted by
// fencing.CheckGrantCreate and renewed and released as their steward by
// fencing.CheckRenew and CheckRelease; the kubelet and the containers are
// simulated. Each Pod may meet one of these: the write that starts it is
// lost (and retried), it is deleted while it waits, it is deleted while it
// runs, or its kubelet is lost (its node's heartbeat stops, its status is
// no longer updated, and its containers go on writing with their fence).
const FaultGatedPod Fault = "gated-pod"

// podManager is the manager's identity, the steward of the Pods' grants.
const podManager = "system:serviceaccount:lockwarden-system:lockwarden-controller-manager"

// nodeLeaseDuration is the simulated nodes' heartbeat Lease duration, and
// nodeHeartbeat how often a live kubelet renews it (a quarter, as the
// kubelet's 10 s of 40 s).
const (
	nodeLeaseDuration = 8 * time.Second
	nodeHeartbeat     = 2 * time.Second
)

// gatedPods are a round's lock-gated Pods, by name.
type gatedPods struct {
	pods map[string]*simPod
	// releasedAt is when the manager's release (or withdrawal) of each
	// grant was admitted.
	releasedAt map[types.UID]time.Duration
	// broken breaks the manager's handling of Pods (tests only).
	broken podBreak
}

// podBreak is a way to break the manager, to show the oracle notices; 0
// breaks nothing.
type podBreak int

const (
	// podStartsUngranted starts a Pod as soon as its grant is requested.
	podStartsUngranted podBreak = iota + 1
	// podRenewsBlind renews whatever the node's heartbeat says.
	podRenewsBlind
	// podNeverReleases releases no grant and withdraws no request.
	podNeverReleases
)

// simPod is a gated Pod: the API object, and what only its node knows.
type simPod struct {
	w     *world
	name  string
	owner string
	// api is the Pod as the API server stores it; nil once it is gone.
	api *corev1.Pod
	// node is the node the Pod is bound to once it starts; kubeletLost
	// says its kubelet stopped (heartbeat, status, kills) at lostAt;
	// lastHeartbeat is when the node's Lease was last renewed.
	node          string
	kubeletLost   bool
	lostAt        time.Duration
	lastHeartbeat time.Duration
	// running says the containers run; they started under startGrant
	// with startFence, read from the Pod's annotations.
	running    bool
	startGrant types.UID
	startFence int64
	startProof fencing.Proof
	// deletedWaiting is when the Pod was deleted before it started, and
	// finishedAt when its containers exited on a live kubelet (0: never).
	deletedWaiting, finishedAt time.Duration
	// loseStart makes the next start write fail; seen fingerprints the
	// Pod and its grants as the controller last reconciled them; requeueAt
	// is the controller's one pending requeue of the Pod (0: none).
	loseStart bool
	seen      string
	requeueAt time.Duration
}

// scheduleGatedPods creates the round's gated Pods when the round plays
// them.
func (w *world) scheduleGatedPods() {
	if !w.fault[FaultGatedPod] {
		return
	}
	if w.gated == nil {
		w.gated = &gatedPods{}
	}
	w.gated.pods, w.gated.releasedAt = map[string]*simPod{}, map[types.UID]time.Duration{}
	for i := range 2 + w.rng.IntN(4) {
		w.s.after(w.between(0, w.horizon/2), func() { w.createPod(i) })
	}
}

// createPod admits Pod i as the gated-Pod webhook does: checked, gated,
// labeled and stamped with its admission time.
func (w *world) createPod(i int) {
	sa := fmt.Sprintf("job-%d", i%2)
	ttl := 2 + w.rng.IntN(7)
	annotations := map[string]string{lockingv1alpha1.LockAnnotation: w.resource, lockingv1alpha1.TTLAnnotation: fmt.Sprintf("%ds", ttl)}
	if _, errs := podgate.ParseRequest(annotations); len(errs) > 0 {
		panic(errs.ToAggregate())
	}
	owner := podgate.Owner(namespace, sa)
	if err := fencing.CheckGatedPod(fencing.GatedPod{Namespace: namespace, Owner: owner, MayAcquire: func() (bool, error) { return true, nil }}); err != nil {
		panic(err)
	}
	w.reg.uids++
	annotations[lockingv1alpha1.RequestedAtAnnotation] = w.reg.wall(w.s.now).Format(time.RFC3339Nano)
	p := &simPod{w: w, name: fmt.Sprintf("settle-%d", i), owner: owner, node: fmt.Sprintf("node-%d", i), lastHeartbeat: w.s.now}
	p.api = &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: p.name, UID: types.UID(fmt.Sprintf("pod-%d", w.reg.uids)),
			Labels: map[string]string{lockingv1alpha1.GatedLabel: "true"}, Annotations: annotations},
		Spec: corev1.PodSpec{ServiceAccountName: sa, SchedulingGates: []corev1.PodSchedulingGate{{Name: lockingv1alpha1.PodSchedulingGate}}},
	}
	w.gated.pods[p.name] = p
	switch r := w.rng.Float64(); {
	case r < 0.25:
		p.loseStart = true
	case r < 0.45:
		w.s.after(w.between(50*time.Millisecond, 5*time.Second), p.deleteIfWaiting)
	}
	w.s.after(nodeHeartbeat, p.heartbeat)
	w.s.after(w.between(time.Millisecond, 20*time.Millisecond), p.reconcile)
	p.watch()
}

// heartbeat renews the node's Lease while its kubelet lives.
func (p *simPod) heartbeat() {
	if p.kubeletLost {
		return
	}
	p.lastHeartbeat = p.w.s.now
	p.w.s.after(nodeHeartbeat, p.heartbeat)
}

// watch reconciles the Pod when it or its grants changed, as the
// controller's watches do, a few hundred milliseconds late at most.
func (p *simPod) watch() {
	w := p.w
	if fp := p.fingerprint(); fp != p.seen {
		p.seen = fp
		w.s.after(w.between(time.Millisecond, 30*time.Millisecond), p.reconcile)
	}
	w.s.after(250*time.Millisecond, p.watch)
}

func (p *simPod) fingerprint() string {
	fp := "gone"
	if p.api != nil {
		fp = fmt.Sprint(p.api.Spec.SchedulingGates, p.api.Spec.NodeName, p.api.Status.Phase, p.api.DeletionTimestamp != nil, len(p.api.Annotations))
	}
	for _, g := range p.grants() {
		fp += fmt.Sprint(g.UID, g.Status.Phase, g.Spec.Release, g.Spec.Renewals, g.Status.ObservedRenewals)
	}
	return fp
}

// grants are the stored grants requested for Pods of this name.
func (p *simPod) grants() []*lockingv1alpha1.LockGrant {
	var out []*lockingv1alpha1.LockGrant
	for _, g := range p.w.reg.grants {
		if ref := podgate.PodOf(g); ref != nil && ref.Name == p.name {
			out = append(out, g)
		}
	}
	slices.SortFunc(out, func(a, b *lockingv1alpha1.LockGrant) int { return compareUID(a.UID, b.UID) })
	return out
}

// reconcile is one pass of the podgate controller: gather, Decide, apply.
func (p *simPod) reconcile() {
	w := p.w
	now := w.s.now
	f := podgate.Facts{Now: w.reg.wall(now)}
	for _, g := range p.grants() {
		f.Grants = append(f.Grants, g.DeepCopy())
	}
	if p.api != nil {
		f.Pod = p.api.DeepCopy()
		r, errs := podgate.ParseRequest(f.Pod.Annotations)
		if len(errs) > 0 {
			f.RequestErr = errs.ToAggregate()
		}
		f.Request = r
		f.Ahead = p.ahead()
	}
	if podgate.NodeReadNeeded(f) {
		f.Node = podgate.HeartbeatLive
		s := &fencing.Session{UID: p.node, Holder: p.node, Duration: nodeLeaseDuration, ObservedAt: w.reg.wall(p.lastHeartbeat)}
		if fencing.CheckSession(s, p.node, p.node, w.reg.wall(now)) != nil && w.gated.broken != podRenewsBlind {
			f.Node = podgate.HeartbeatLapsed
		}
	}
	plan := podgate.Decide(f)
	switch w.gated.broken {
	case podNeverReleases:
		plan.Release = nil
	case podStartsUngranted:
		if f.Pod != nil && podgate.Gated(f.Pod) && len(f.Grants) > 0 && plan.Start == nil {
			plan.Start = map[string]string{}
		}
	}
	for _, g := range plan.Release {
		p.checkRelease(g)
		if err := w.reg.release(g.UID, podManager, now); err == nil {
			if _, ok := w.gated.releasedAt[g.UID]; !ok {
				w.gated.releasedAt[g.UID] = now
			}
			w.kick(w.resource)
		}
	}
	for _, g := range plan.Requests {
		w.requestForPod(g)
	}
	if plan.Start != nil {
		if p.loseStart {
			// The write is lost: the controller sees an error and
			// decides again after its backoff.
			p.loseStart = false
			w.rep.Faults["gate-removal-lost"]++
			w.s.after(w.between(5*time.Millisecond, 500*time.Millisecond), p.reconcile)
		} else {
			p.start(plan.Start)
		}
	}
	if g := plan.Renew; g != nil {
		p.checkRenew(g)
		if err := w.reg.renew(g.UID, podManager, g.Spec.Renewals+1, now); err == nil {
			w.kick(w.resource)
		}
	}
	if plan.End != nil && p.api != nil && p.api.DeletionTimestamp == nil {
		w.rep.Faults["gated-pod-ended-"+plan.End.Reason]++
		p.delete()
	}
	if plan.RequeueAfter > 0 {
		p.requeue(now + plan.RequeueAfter)
	}
}

// requeue reconciles the Pod at t, as the controller's work queue does:
// one pending requeue per Pod, the earliest.
func (p *simPod) requeue(t time.Duration) {
	if p.requeueAt != 0 && p.requeueAt <= t {
		return
	}
	p.requeueAt = t
	p.w.s.at(t, func() {
		if p.requeueAt == t {
			p.requeueAt = 0
			p.reconcile()
		}
	})
}

// ahead are the gated Pods of the lock admitted before this one with no
// grant yet, as the controller gathers them.
func (p *simPod) ahead() []*corev1.Pod {
	var out []*corev1.Pod
	for _, o := range p.w.gated.pods {
		if o == p || o.api == nil || !podgate.Gated(o.api) || !podgate.AdmittedBefore(o.api, p.api) {
			continue
		}
		if _, ok := p.w.reg.byReq[lockingv1alpha1.PodRequestID(string(o.api.UID))]; !ok {
			out = append(out, o.api.DeepCopy())
		}
	}
	slices.SortFunc(out, func(a, b *corev1.Pod) int {
		if podgate.AdmittedBefore(a, b) {
			return -1
		}
		return 1
	})
	return out
}

// requestForPod admits a grant the manager requests for a Pod, as the
// LockGrant webhooks do (fencing.CheckGrantCreate, the steward's stamp),
// and stores it.
func (w *world) requestForPod(g *lockingv1alpha1.LockGrant) {
	if uid, ok := w.reg.byReq[g.Spec.RequestID]; ok && w.reg.grants[uid] != nil {
		return // AlreadyExists
	}
	ref := podgate.PodOf(g)
	err := fencing.CheckGrantCreate(fencing.GrantCreate{
		Requester: podManager, Owner: g.Spec.Owner, Manager: podManager, Namespace: g.Namespace, Resource: g.Spec.Resource,
		RequestID: g.Spec.RequestID, RequestedAt: g.Annotations[lockingv1alpha1.RequestedAtAnnotation], Pod: ref,
		ReadPod: func() (*fencing.BoundPod, error) {
			if o := w.gated.pods[ref.Name]; o != nil && o.api != nil {
				return podgate.BoundPodOf(o.api), nil
			}
			return nil, nil
		},
		MayAcquire: func() (bool, error) { return true, nil },
	})
	if err != nil {
		w.rep.Rejected[string(fencing.ReasonOf(err))]++
		return
	}
	w.reg.uids++
	w.reg.rv++
	g = g.DeepCopy()
	g.UID = types.UID(fmt.Sprintf("uid-%d", w.reg.uids))
	g.Name = string(g.UID) // the simulation names grants by UID
	g.ResourceVersion = strconv.FormatInt(w.reg.rv, 10)
	g.Annotations[lockingv1alpha1.StewardAnnotation] = podManager
	w.reg.grants[g.UID] = g
	w.reg.byReq[g.Spec.RequestID] = g.UID
	w.kick(w.resource)
}

// start is the write that starts the Pod: the grant's annotations and the
// gate's removal, at once. The scheduler binds it, and the kubelet starts
// its containers, which read the annotations then.
func (p *simPod) start(annotations map[string]string) {
	w := p.w
	if p.api == nil || !podgate.Gated(p.api) {
		return // the precondition on the Pod's version fails
	}
	for k, v := range annotations {
		p.api.Annotations[k] = v
	}
	p.api.Spec.SchedulingGates = nil
	w.s.after(w.between(20*time.Millisecond, 300*time.Millisecond), func() {
		if p.api == nil || p.api.DeletionTimestamp != nil {
			return
		}
		p.api.Spec.NodeName = p.node
		w.s.after(w.between(50*time.Millisecond, 500*time.Millisecond), p.run)
	})
}

// run starts the containers, with what the Pod's annotations say then,
// and plays the Pod's work: writes under its fence, an exit, and maybe a
// deletion or a lost kubelet on the way.
func (p *simPod) run() {
	w := p.w
	if p.api == nil || p.api.DeletionTimestamp != nil || p.kubeletLost {
		return
	}
	uid := types.UID(p.api.Annotations[lockingv1alpha1.GrantUIDAnnotation])
	fence, err := fencing.ParseFence(p.api.Annotations[lockingv1alpha1.FenceAnnotation])
	if _, issued := w.h.heldSince[uid]; err != nil || !issued || w.h.fenceOf[uid] != fence {
		w.rep.PodGateBroken++
		w.rep.violate("seed %d: Pod %s started at %s without the fence of a grant that was Held (grant %q, fence %q)",
			w.seed, p.name, w.s.now, uid, p.api.Annotations[lockingv1alpha1.FenceAnnotation])
		return
	}
	p.running, p.startGrant, p.startFence = true, uid, fence
	p.startProof = fencing.Proof(p.api.Annotations[lockingv1alpha1.ProofAnnotation])
	p.api.Status.Phase = corev1.PodRunning
	work := w.between(time.Second, 8*time.Second)
	switch r := w.rng.Float64(); {
	case r < 0.25:
		w.s.after(w.between(0, work), func() {
			if p.running && p.api != nil {
				w.rep.Faults["gated-pod-deleted-while-running"]++
				p.delete()
			}
		})
	case r < 0.5:
		w.s.after(w.between(0, work), func() {
			if p.running {
				w.rep.Faults["gated-pod-kubelet-lost"]++
				p.kubeletLost, p.lostAt = true, w.s.now
				work = w.horizon // its containers go on, unseen
			}
		})
	}
	w.s.after(work, p.exit)
	p.write()
	w.rep.Faults[string(FaultGatedPod)]++
}

// write is one guarded write of the containers, as the Pod's
// ServiceAccount, with the claim the Pod carries; they write until they
// exit or are killed.
func (p *simPod) write() {
	w := p.w
	if !p.running {
		return
	}
	msg := writeMsg{op: fencing.OpUpdate, upsert: true, body: bodyStamped, caller: p.owner, target: w.resource,
		data: p.name, uid: p.startGrant, fence: p.startFence, proof: p.startProof, writeID: newWriteID()}
	w.s.after(w.netDelay(), func() { w.deliver(msg) })
	w.s.after(w.between(200*time.Millisecond, 700*time.Millisecond), p.write)
}

// exit ends the containers; a live kubelet reports the Pod finished.
func (p *simPod) exit() {
	if !p.running || p.kubeletLost {
		return
	}
	p.running = false
	if p.api != nil {
		p.finishedAt = p.w.s.now
		p.api.Status.Phase = corev1.PodSucceeded
		if p.w.chance(0.2) {
			p.api.Status.Phase = corev1.PodFailed
		}
	}
}

// delete deletes the Pod: at once when it never ran on a node, else its
// live kubelet stops the containers within their grace period and the Pod
// is gone; a lost kubelet does neither.
func (p *simPod) delete() {
	w := p.w
	if p.api == nil || p.api.DeletionTimestamp != nil {
		return
	}
	if p.api.Spec.NodeName == "" {
		p.gone()
		return
	}
	p.api.DeletionTimestamp = &metav1.Time{Time: w.reg.wall(w.s.now)}
	if p.kubeletLost {
		return
	}
	w.s.after(w.between(100*time.Millisecond, 2*time.Second), func() {
		if p.kubeletLost {
			return
		}
		p.running = false
		p.gone()
	})
}

// deleteIfWaiting deletes a Pod that has not started yet.
func (p *simPod) deleteIfWaiting() {
	if p.api == nil || !podgate.Gated(p.api) {
		return
	}
	p.w.rep.Faults["gated-pod-deleted-while-waiting"]++
	p.deletedWaiting = p.w.s.now
	p.gone()
}

func (p *simPod) gone() { p.api = nil }

// checkRelease requires that the manager never gives back the lock of a
// Pod whose containers run on a live kubelet while the Pod is neither
// finished nor being deleted.
func (p *simPod) checkRelease(g *lockingv1alpha1.LockGrant) {
	if ref := podgate.PodOf(g); ref == nil || p.api == nil || ref.UID != string(p.api.UID) || g.Status.Phase != lockingv1alpha1.PhaseHeld || p.w.restoredAt > 0 {
		return
	}
	if p.running && !p.kubeletLost && p.api.DeletionTimestamp == nil && p.api.Status.Phase == corev1.PodRunning {
		w := p.w
		w.rep.PodGateBroken++
		w.rep.violate("seed %d: the grant %s of running Pod %s released at %s", w.seed, g.UID, p.name, w.s.now)
	}
}

// checkRenew requires that the manager never renews the grant of a Pod
// whose node's heartbeat has lapsed.
func (p *simPod) checkRenew(g *lockingv1alpha1.LockGrant) {
	w := p.w
	if p.api != nil && p.api.Spec.NodeName != "" && w.s.now >= p.lastHeartbeat+nodeLeaseDuration+fencing.SessionMargin {
		w.rep.PodGateBroken++
		w.rep.violate("seed %d: the grant %s of Pod %s renewed at %s, its node's heartbeat lapsed at %s", w.seed, g.UID, p.name, w.s.now,
			p.lastHeartbeat+nodeLeaseDuration+fencing.SessionMargin)
	}
}

// checkGatedPods requires, at the end of the round, that the manager
// withdrew the request of a Pod deleted while it waited, and released the
// grant of a Pod that finished, within a reconcile (unless the grant had
// ended), and that the grant of a Pod whose kubelet was lost ended within
// its node's Lease and a lease (plus a reconcile).
func (w *world) checkGatedPods() {
	if w.gated == nil || w.gated.pods == nil || w.restoredAt > 0 {
		return // a restore rolls grants back: their ends say nothing of the manager
	}
	const slack = time.Second
	for _, name := range slices.Sorted(maps.Keys(w.gated.pods)) {
		p := w.gated.pods[name]
		for _, g := range p.grants() {
			ended, ok := w.h.endedAt[g.UID]
			if !ok {
				ended = w.horizon
			}
			given := ended // when the lock was given back
			if r, ok := w.gated.releasedAt[g.UID]; ok {
				given = min(given, r)
			}
			ttl := time.Duration(g.Spec.LeaseDurationSeconds) * time.Second
			switch {
			case p.deletedWaiting > 0 && p.deletedWaiting+slack < given:
				w.rep.PodGateBroken++
				w.rep.violate("seed %d: the request %s of Pod %s, deleted at %s while it waited, was given back at %s", w.seed, g.UID, p.name, p.deletedWaiting, given)
			case p.finishedAt > 0 && g.UID == p.startGrant && p.finishedAt+slack < given && w.h.expiresAt[g.UID] > p.finishedAt+slack:
				// (A lease that was ending anyway ends by the grant
				// controller's clock, not the Pod's release.)
				w.rep.PodGateBroken++
				w.rep.violate("seed %d: the grant %s of Pod %s, finished at %s, was given back at %s", w.seed, g.UID, p.name, p.finishedAt, given)
			case ok && ended < w.horizon:
			case p.kubeletLost && g.UID == p.startGrant && p.lostAt+nodeLeaseDuration+fencing.SessionMargin+ttl+slack+w.replicaLag() < w.horizon &&
				facts.Grant(g).State == fencing.StateHeld:
				w.rep.PodGateBroken++
				w.rep.violate("seed %d: the grant %s of Pod %s, whose kubelet was lost at %s, still held at the end", w.seed, g.UID, p.name, p.lostAt)
			}
		}
	}
}
