package podgate

import (
	"errors"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
)

var t0 = time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

// gatedPod is Pod settle-0 (UID uid) as admission created it.
func gatedPod(uid string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "billing", Name: "settle-0", UID: types.UID("u" + uid),
			Annotations: map[string]string{lockingv1alpha1.LockAnnotation: "invoice-batch/2026-07-19", lockingv1alpha1.RequestedAtAnnotation: "2026-07-19T00:00:00Z"}},
		Spec: corev1.PodSpec{ServiceAccountName: "worker", SchedulingGates: []corev1.PodSchedulingGate{{Name: lockingv1alpha1.PodSchedulingGate}}},
	}
}

// grantOf is the grant requested for p, in phase ph.
func grantOf(p *corev1.Pod, ph lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
	g := GrantFor(p, Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30})
	g.UID = "g-" + p.UID
	g.Status.Phase = ph
	if ph == lockingv1alpha1.PhaseHeld || ph == lockingv1alpha1.PhaseExpired {
		g.Status.FenceToken = 7
		g.Status.Proof = "lgv1.r.s"
		g.Status.GrantedAt = &metav1.MicroTime{Time: at(0)}
		g.Status.ExpiresAt = &metav1.MicroTime{Time: at(30)}
	}
	return g
}

// startedPod is p after the manager started it under g.
func startedPod(p *corev1.Pod, g *lockingv1alpha1.LockGrant) *corev1.Pod {
	p = p.DeepCopy()
	p.Spec.SchedulingGates = nil
	for k, v := range StartAnnotations(g) {
		p.Annotations[k] = v
	}
	return p
}

func withPod(p *corev1.Pod, f func(*corev1.Pod)) *corev1.Pod { p = p.DeepCopy(); f(p); return p }

func withGrant(g *lockingv1alpha1.LockGrant, f func(*lockingv1alpha1.LockGrant)) *lockingv1alpha1.LockGrant {
	g = g.DeepCopy()
	f(g)
	return g
}

func deleting(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: t0} }

func onNode(p *corev1.Pod) { p.Spec.NodeName = "node-a" }

// want describes a plan by what it does.
type want struct {
	request, start, renew bool
	release               []string // names of grants released
	end                   string   // End reason
	events                []string // Event reasons
	requeue               time.Duration
}

func describe(p Plan) want {
	w := want{request: len(p.Requests) > 0, start: p.Start != nil, renew: p.Renew != nil, requeue: p.RequeueAfter}
	for _, g := range p.Release {
		w.release = append(w.release, g.Name)
	}
	if p.End != nil {
		w.end = p.End.Reason
	}
	for _, e := range p.Events {
		w.events = append(w.events, e.Reason)
	}
	return w
}

func TestDecide(t *testing.T) {
	p := gatedPod("1")
	pending := grantOf(p, lockingv1alpha1.PhasePending)
	held := grantOf(p, lockingv1alpha1.PhaseHeld)
	running := withPod(startedPod(p, held), onNode)
	inFlight := withGrant(held, func(g *lockingv1alpha1.LockGrant) { g.Spec.Renewals = 1 })
	ended := func(ph lockingv1alpha1.LockGrantPhase) *lockingv1alpha1.LockGrant {
		return withGrant(held, func(g *lockingv1alpha1.LockGrant) { g.Status.Phase = ph })
	}
	succeeded := func(q *corev1.Pod) { q.Status.Phase = corev1.PodSucceeded }
	replacement := gatedPod("2")
	cases := []struct {
		name string
		f    Facts
		want want
	}{
		{"a new gated Pod requests its grant", Facts{Now: at(0), Pod: p}, want{request: true}},
		{"a Pod whose annotations no longer parse requests nothing, and says so", Facts{Now: at(0), Pod: p, RequestErr: errors.New("bad ttl")},
			want{events: []string{lockingv1alpha1.GatedPodReasonInvalidRequest}}},
		{"a waiting Pod waits", Facts{Now: at(0), Pod: p, Grants: []*lockingv1alpha1.LockGrant{pending}}, want{}},
		{"a Held grant starts its Pod", Facts{Now: at(1), Pod: p, Grants: []*lockingv1alpha1.LockGrant{held}},
			want{start: true, events: []string{lockingv1alpha1.GatedPodReasonGranted}}},
		{"a Pod deleted while waiting withdraws", Facts{Now: at(0), Pod: withPod(p, deleting), Grants: []*lockingv1alpha1.LockGrant{pending}},
			want{release: []string{pending.Name}}},
		{"a Pod deleted as its grant came is not started", Facts{Now: at(1), Pod: withPod(p, deleting), Grants: []*lockingv1alpha1.LockGrant{held}},
			want{release: []string{held.Name}}},
		{"a finished Pod releases", Facts{Now: at(5), Pod: withPod(running, succeeded), Grants: []*lockingv1alpha1.LockGrant{held}},
			want{release: []string{held.Name}}},
		{"a finished Pod whose grant expired needs nothing", Facts{Now: at(40), Pod: withPod(running, succeeded), Grants: []*lockingv1alpha1.LockGrant{ended(lockingv1alpha1.PhaseExpired)}},
			want{}},
		{"a running Pod renews a third of the lease in", Facts{Now: at(5), Pod: running, Grants: []*lockingv1alpha1.LockGrant{held}},
			want{requeue: 5 * time.Second}},
		{"a running Pod renews while its node is live", Facts{Now: at(10), Pod: running, Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive},
			want{renew: true, requeue: 20 * time.Second}},
		{"a Pod not yet on a node renews without a heartbeat", Facts{Now: at(10), Pod: startedPod(p, held), Grants: []*lockingv1alpha1.LockGrant{held}},
			want{renew: true, requeue: 20 * time.Second}},
		{"a Pod on a lost node is not renewed", Facts{Now: at(10), Pod: running, Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLapsed},
			want{events: []string{lockingv1alpha1.GatedPodReasonNodeLost}, requeue: 20 * time.Second}},
		{"a Pod whose started container is not ready is not renewed", Facts{Now: at(10), Pod: withPod(running, func(q *corev1.Pod) {
			q.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "settle", Started: ptr.To(true), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		}), Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive},
			want{events: []string{lockingv1alpha1.GatedPodReasonNotReady}, requeue: 20 * time.Second}},
		{"a Pod whose container is still starting is renewed", Facts{Now: at(10), Pod: withPod(running, func(q *corev1.Pod) {
			q.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "settle", Started: ptr.To(false), State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}
		}), Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive},
			want{renew: true, requeue: 20 * time.Second}},
		{"a renewal is not sent twice", Facts{Now: at(10), Pod: running, Grants: []*lockingv1alpha1.LockGrant{inFlight}, Node: HeartbeatLive},
			want{requeue: 20 * time.Second}},
		{"a lease over by the clock is left to the grant controller", Facts{Now: at(30), Pod: running, Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive},
			want{}},
		{"a running Pod whose grant expired is ended", Facts{Now: at(31), Pod: running, Grants: []*lockingv1alpha1.LockGrant{ended(lockingv1alpha1.PhaseExpired)}},
			want{end: lockingv1alpha1.GatedPodReasonLockLost}},
		{"a running Pod whose grant was revoked is ended", Facts{Now: at(5), Pod: running, Grants: []*lockingv1alpha1.LockGrant{ended(lockingv1alpha1.PhaseRevoked)}},
			want{end: lockingv1alpha1.GatedPodReasonLockLost}},
		{"a running Pod whose grant was deleted is ended", Facts{Now: at(5), Pod: running}, want{end: lockingv1alpha1.GatedPodReasonLockLost}},
		{"a terminating running Pod keeps renewing", Facts{Now: at(10), Pod: withPod(running, deleting), Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive},
			want{renew: true, requeue: 20 * time.Second}},
		{"a terminating Pod whose grant ended is not ended again", Facts{Now: at(31), Pod: withPod(running, deleting), Grants: []*lockingv1alpha1.LockGrant{ended(lockingv1alpha1.PhaseExpired)}},
			want{}},
		{"a waiting Pod whose request ended is ended", Facts{Now: at(5), Pod: p, Grants: []*lockingv1alpha1.LockGrant{withGrant(pending, func(g *lockingv1alpha1.LockGrant) {
			g.Status.Phase = lockingv1alpha1.PhaseReleased
		})}}, want{end: lockingv1alpha1.GatedPodReasonRequestEnded}},
		{"a release asked for is left to end", Facts{Now: at(5), Pod: running, Grants: []*lockingv1alpha1.LockGrant{withGrant(held, func(g *lockingv1alpha1.LockGrant) { g.Spec.Release = true })}},
			want{}},
		{"a gate removed by hand while waiting ends the Pod", Facts{Now: at(5), Pod: withPod(p, func(q *corev1.Pod) { q.Spec.SchedulingGates = nil }), Grants: []*lockingv1alpha1.LockGrant{pending}},
			want{release: []string{pending.Name}, end: lockingv1alpha1.GatedPodReasonGateRemoved}},
		{"a gate removed by hand before the request ends the Pod", Facts{Now: at(5), Pod: withPod(p, func(q *corev1.Pod) { q.Spec.SchedulingGates = nil })},
			want{end: lockingv1alpha1.GatedPodReasonGateRemoved}},
		{"a gate removed by hand as the grant came ends the Pod, which keeps the lease until it is gone", Facts{Now: at(5), Pod: withPod(p, func(q *corev1.Pod) { q.Spec.SchedulingGates = nil }), Grants: []*lockingv1alpha1.LockGrant{held}},
			want{end: lockingv1alpha1.GatedPodReasonGateRemoved}},
		{"a running Pod whose grant annotations were changed is ended, and keeps the lease until it is gone", Facts{Now: at(5), Pod: withPod(running, func(q *corev1.Pod) {
			q.Annotations[lockingv1alpha1.GrantUIDAnnotation] = "another"
		}), Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive}, want{end: lockingv1alpha1.GatedPodReasonGateRemoved}},
		{"such a Pod, being deleted, keeps renewing", Facts{Now: at(10), Pod: withPod(running, func(q *corev1.Pod) {
			q.Annotations[lockingv1alpha1.GrantUIDAnnotation] = "another"
			deleting(q)
		}), Grants: []*lockingv1alpha1.LockGrant{held}, Node: HeartbeatLive}, want{renew: true, requeue: 20 * time.Second}},
		{"the grant of a Pod that is gone is released", Facts{Now: at(5), Grants: []*lockingv1alpha1.LockGrant{held}},
			want{release: []string{held.Name}}},
		{"the ended grant of a Pod that is gone needs nothing", Facts{Now: at(5), Grants: []*lockingv1alpha1.LockGrant{ended(lockingv1alpha1.PhaseReleased)}},
			want{}},
		{"a Pod replaced under the same name: the old grant goes, the new Pod requests", Facts{Now: at(5), Pod: replacement, Grants: []*lockingv1alpha1.LockGrant{held}},
			want{release: []string{held.Name}, request: true}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if c.f.Request == (Request{}) {
				c.f.Request = Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30}
			}
			got := describe(Decide(c.f))
			if !equal(got, c.want) {
				t.Fatalf("plan %+v, want %+v", got, c.want)
			}
		})
	}
}

func equal(a, b want) bool {
	if a.request != b.request || a.start != b.start || a.renew != b.renew || a.end != b.end || a.requeue != b.requeue ||
		len(a.release) != len(b.release) || len(a.events) != len(b.events) {
		return false
	}
	for i := range a.release {
		if a.release[i] != b.release[i] {
			return false
		}
	}
	for i := range a.events {
		if a.events[i] != b.events[i] {
			return false
		}
	}
	return true
}

// The write that starts a Pod carries every annotation its containers
// read, the proof included, and the slot it holds.
func TestStartAnnotations(t *testing.T) {
	g := grantOf(gatedPod("1"), lockingv1alpha1.PhaseHeld)
	k := int32(2)
	g.Status.Permit, g.Status.FencedResource = &k, lockingv1alpha1.SlotResource(g.Spec.Resource, 2)
	a := StartAnnotations(g)
	want := map[string]string{
		lockingv1alpha1.GrantAnnotation: g.Name, lockingv1alpha1.GrantUIDAnnotation: string(g.UID), lockingv1alpha1.FenceAnnotation: "7",
		lockingv1alpha1.ProofAnnotation: "lgv1.r.s", lockingv1alpha1.FencedResourceAnnotation: "invoice-batch/2026-07-19#2",
	}
	if len(a) != len(want) {
		t.Fatalf("got %v, want %v", a, want)
	}
	for k, v := range want {
		if a[k] != v {
			t.Fatalf("got %v, want %v", a, want)
		}
	}
}

// Only a holder whose renewal is due, on a node, costs a read of the
// node's Lease; a waiter never does.
func TestNodeReadNeeded(t *testing.T) {
	p := gatedPod("1")
	held := grantOf(p, lockingv1alpha1.PhaseHeld)
	running := withPod(startedPod(p, held), onNode)
	for _, c := range []struct {
		name string
		f    Facts
		want bool
	}{
		{"due, on a node", Facts{Now: at(10), Pod: running, Grants: []*lockingv1alpha1.LockGrant{held}}, true},
		{"not due", Facts{Now: at(9), Pod: running, Grants: []*lockingv1alpha1.LockGrant{held}}, false},
		{"not on a node", Facts{Now: at(10), Pod: startedPod(p, held), Grants: []*lockingv1alpha1.LockGrant{held}}, false},
		{"waiting", Facts{Now: at(10), Pod: withPod(p, onNode), Grants: []*lockingv1alpha1.LockGrant{grantOf(p, lockingv1alpha1.PhasePending)}}, false},
		{"gone", Facts{Now: at(10), Grants: []*lockingv1alpha1.LockGrant{held}}, false},
	} {
		if got := NodeReadNeeded(c.f); got != c.want {
			t.Errorf("%s: NodeReadNeeded = %v, want %v", c.name, got, c.want)
		}
	}
}

// A Pod's grant is requested after those of the gated Pods of its lock
// admitted before it that have none yet (and still wait for one), so that
// grants reach the queue in the order their Pods were admitted.
func TestDecideRequestsThePodsAheadFirst(t *testing.T) {
	p := gatedPod("3")
	first, second := gatedPod("1"), gatedPod("2")
	first.Name, second.Name = "settle-a", "settle-b"
	gone := withPod(gatedPod("9"), deleting)
	other := withPod(gatedPod("8"), func(q *corev1.Pod) { q.Annotations[lockingv1alpha1.LockAnnotation] = "other" })
	plan := Decide(Facts{Now: at(0), Pod: p, Request: Request{Resource: "invoice-batch/2026-07-19", LeaseSeconds: 30},
		Ahead: []*corev1.Pod{first, gone, second, other}})
	var got []string
	for _, g := range plan.Requests {
		got = append(got, podOfName(g))
	}
	if want := []string{"settle-a", "settle-b", "settle-0"}; !slices.Equal(got, want) {
		t.Fatalf("requests for %v, want %v", got, want)
	}
}

func podOfName(g *lockingv1alpha1.LockGrant) string { return PodOf(g).Name }

func TestFinished(t *testing.T) {
	terminated := corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{}}
	running := corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}
	ended := func(q *corev1.Pod) {
		q.Spec.RestartPolicy = corev1.RestartPolicyNever
		q.Spec.Containers = []corev1.Container{{Name: "a"}, {Name: "b"}}
		q.Status.Phase = corev1.PodRunning
		q.Status.ContainerStatuses = []corev1.ContainerStatus{{Name: "a", State: terminated}, {Name: "b", State: terminated}}
	}
	p := withPod(gatedPod("1"), ended)
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		want bool
	}{
		{"Succeeded", withPod(gatedPod("1"), func(q *corev1.Pod) { q.Status.Phase = corev1.PodSucceeded }), true},
		{"Failed", withPod(gatedPod("1"), func(q *corev1.Pod) { q.Status.Phase = corev1.PodFailed }), true},
		{"Running, every container of a Pod that restarts none terminated", p, true},
		{"one container still runs", withPod(p, func(q *corev1.Pod) { q.Status.ContainerStatuses[1].State = running }), false},
		{"one container not reported yet", withPod(p, func(q *corev1.Pod) { q.Status.ContainerStatuses = q.Status.ContainerStatuses[:1] }), false},
		{"restartPolicy OnFailure", withPod(p, func(q *corev1.Pod) { q.Spec.RestartPolicy = corev1.RestartPolicyOnFailure }), false},
		{"a container that restarts itself", withPod(p, func(q *corev1.Pod) {
			q.Spec.Containers[0].RestartPolicy = ptr.To(corev1.ContainerRestartPolicyAlways)
		}), false},
		{"a sidecar whose exit restarts every container", withPod(p, func(q *corev1.Pod) {
			q.Spec.InitContainers = []corev1.Container{{Name: "watcher", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
				RestartPolicyRules: []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestartAllContainers,
					ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{88}}}}}}
			q.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "watcher", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 88}}}}
		}), false},
		{"an init container with restart rules", withPod(p, func(q *corev1.Pod) {
			q.Spec.InitContainers = []corev1.Container{{Name: "setup", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyNever),
				RestartPolicyRules: []corev1.ContainerRestartRule{{Action: corev1.ContainerRestartRuleActionRestartAllContainers,
					ExitCodes: &corev1.ContainerRestartRuleOnExitCodes{Operator: corev1.ContainerRestartRuleOnExitCodesOpIn, Values: []int32{88}}}}}}
			q.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "setup", State: terminated}}
		}), false},
		{"a sidecar that stopped, without restart rules", withPod(p, func(q *corev1.Pod) {
			q.Spec.InitContainers = []corev1.Container{{Name: "proxy", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
			q.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", State: terminated}}
		}), true},
		{"every container restarting in place", withPod(p, func(q *corev1.Pod) {
			q.Status.Conditions = []corev1.PodCondition{{Type: corev1.AllContainersRestarting, Status: corev1.ConditionTrue}}
		}), false},
		{"a sidecar still runs", withPod(p, func(q *corev1.Pod) {
			q.Status.InitContainerStatuses = []corev1.ContainerStatus{{Name: "proxy", State: running}}
		}), false},
		{"an ephemeral container waits to start", withPod(p, func(q *corev1.Pod) {
			q.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debug"}}}
			q.Status.EphemeralContainerStatuses = []corev1.ContainerStatus{{Name: "debug", State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{}}}}
		}), false},
		{"Pending", withPod(p, func(q *corev1.Pod) { q.Status.Phase = corev1.PodPending }), false},
	} {
		if got := Finished(c.pod); got != c.want {
			t.Errorf("%s: Finished = %v, want %v", c.name, got, c.want)
		}
	}
}
