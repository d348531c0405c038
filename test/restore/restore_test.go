package restore

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/pgtest"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
	"github.com/lockwarden/lockwarden/pkg/store/postgres"
)

// batchKey is the batch's resource in the store.
var batchKey = postgres.Key{Namespace: billing, Resource: batchID}

const (
	// billing is the namespace of the restore test's grants and objects.
	billing = "billing"
	// batch is the invoice batch of the settlement worker; its resource is
	// the one PostgreSQL protects.
	batch   = "2026-07-19"
	batchID = "invoice-batch/" + batch
	// cluster names this control plane's fences in PostgreSQL: the test's
	// store and the worker (--cluster) share the records.
	cluster = "restore-test"
	// heldID is a resource whose grant is Held across the snapshot.
	heldID = "invoice-batch/held-across-restore"
	// Guarded ConfigMaps of the two resources.
	batchObject = "settlement-2026-07-19"
	heldObject  = "settlement-held"
	// bumpRevision is how far etcdutl moves etcd's revision past the
	// snapshot's, beyond every revision the old etcd reached (as the
	// Kubernetes docs suggest).
	bumpRevision = 1_000_000_000
)

// The control plane is restored from an old etcd snapshot, end to end.
//
//	fences 1, 2 of invoice-batch/2026-07-19 accepted by PostgreSQL (and by a guarded ConfigMap); released
//	a grant of another resource is Held (TTL 10 min)
//	SNAPSHOT
//	fences 3, 4 accepted by PostgreSQL and by the ConfigMap; released
//	RESTORE (etcdutl --bump-revision --mark-compacted), restart etcd and kube-apiserver; the manager keeps running
//	the counter says 2 again; the next grants get 3 and 4 again (other UIDs):
//	  PostgreSQL refuses both FENCE_REGRESSION (alarm row, metric, hook); its highest fence stays 4
//	  the holders report it on their grants; the controller raises condition, Event, metric
//	RECOVERY: kubectl patch fenceissuer default --type=merge -p '{"spec":{"epoch":1,"revokedEpochs":[0]}}'
//	  the grant held across the restore is Revoked; it can never renew or write again
//	  the next fence is 1<<40|1; PostgreSQL and the guarded objects accept it
func TestRestoreFromOldSnapshot(t *testing.T) {
	logManagerOnFailure(t)
	ctx := t.Context()
	dsn := pgtest.Database(t)
	if err := admin.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: billing}}); err != nil {
		t.Fatal(err)
	}
	w := as(t, "settlement")
	pg := newLedgerStore(t, dsn, w)

	// Fences 1 and 2, then a grant held across the snapshot.
	for fence := int64(1); fence <= 2; fence++ {
		pg.grantAndWrite(t, fence)
	}
	heldGrant := held(t, w, billing, heldID, 600)
	if err := guardedWrite(ctx, w, billing, heldObject, heldID, heldGrant, "written before the snapshot"); err != nil {
		t.Fatalf("the held grant's write: %v", err)
	}

	snap := filepath.Join(runDir, "snapshot.db")
	if err := cp.saveSnapshot(ctx, snap); err != nil {
		t.Fatalf("saving the etcd snapshot: %v", err)
	}
	t.Logf("etcd snapshot saved: %s", snap)

	// Fences 3 and 4 after the snapshot.
	var lost []*lockingv1alpha1.LockGrant
	for fence := int64(3); fence <= 4; fence++ {
		lost = append(lost, pg.grantAndWrite(t, fence))
	}
	highest := pg.ledger(t)
	if highest.Fence != 4 || highest.GrantUID != string(lost[1].UID) {
		t.Fatalf("ledger before the restore = %+v; want fence 4 of grant %s", highest, lost[1].UID)
	}

	// Restore the snapshot; the manager keeps running through it.
	start := time.Now()
	out, err := cp.restore(ctx, snap, bumpRevision)
	if err != nil {
		t.Fatalf("restoring the snapshot: %v", err)
	}
	t.Logf("stopped, restored and restarted etcd and kube-apiserver in %s", time.Since(start).Round(time.Millisecond))
	for _, l := range strings.Split(out, "\n") {
		if strings.Contains(l, "bumping latest revision") || strings.Contains(l, "marking revision compacted") {
			t.Logf("etcdutl: %s", l)
		}
	}
	if err := manager.Running(); err != nil {
		t.Fatalf("the manager did not survive the restore: %v", err)
	}

	// The registry went back in time: the counter says 2, the grants of
	// fences 3 and 4 are gone. The guarded ConfigMap went back with it: it
	// lives in the same etcd, so its recorded fence is 2 again.
	counter := &lockingv1alpha1.FenceCounter{}
	if err := admin.Get(ctx, client.ObjectKey{Namespace: billing, Name: lockingv1alpha1.FenceCounterName(batchID)}, counter); err != nil || counter.Spec.Fence != 2 {
		t.Fatalf("restored FenceCounter = %+v, %v; want fence 2", counter.Spec, err)
	}
	for _, g := range lost {
		if err := admin.Get(ctx, client.ObjectKeyFromObject(g), &lockingv1alpha1.LockGrant{}); !apierrors.IsNotFound(err) {
			t.Fatalf("grant %s of fence %d after the restore: %v; want it gone", g.Name, g.Status.FenceToken, err)
		}
	}
	if cm := configMap(t, billing, batchObject); cm == nil || cm.Annotations[lockingv1alpha1.AcceptedFenceAnnotation] != "2" || cm.Data["result"] != "written under fence 2" {
		t.Fatalf("restored guarded ConfigMap = %+v; want the write of fence 2", cm)
	}
	if g := waitPhase(t, heldGrant, lockingv1alpha1.PhaseHeld); g.UID != heldGrant.UID {
		t.Fatalf("the grant held across the restore is %s, want %s", g.UID, heldGrant.UID)
	}

	// The next grant gets fence 3 again, as another acquisition. PostgreSQL
	// has accepted fence 4, yet the registry names this grant of fence 3 as
	// the holder: FENCE_REGRESSION. The test plays the holder: its store's
	// hook reports the regression on the grant.
	again3 := held(t, w, billing, batchID, 60)
	if again3.Status.FenceToken != 3 || again3.UID == lost[0].UID {
		t.Fatalf("the restored registry issued fence %d to %s; want fence 3 again, to a new grant", again3.Status.FenceToken, again3.UID)
	}
	_, err = pg.apply(ctx, pg.segment(again3, "op-5", 1))
	if !errors.Is(err, fencing.ErrFenceRegression) {
		t.Fatalf("segment under the reissued fence 3 = %v; want FENCE_REGRESSION", err)
	}
	// The Kubernetes object went back with the registry, so fence 3 is new
	// to it and the write is accepted: a guarded object cannot tell a
	// restore of the etcd it lives in, and needs no alarm for it (its own
	// history went back too). Only a store outside etcd can.
	if err := guardedWrite(ctx, w, billing, batchObject, batchID, again3, "written under the reissued fence 3"); err != nil {
		t.Fatalf("the reissued fence 3 on the restored ConfigMap: %v", err)
	}
	release(t, w, again3)

	// The next grant gets fence 4 again: the settlement worker takes it. Its
	// first segment is refused (fence 4 was accepted from another grant),
	// it reports the regression on its grant, releases it and exits 1.
	workerOut, err := runWorker(t, w, dsn)
	if code := exitCode(err); code != 1 {
		t.Fatalf("the worker under the reissued fence 4 exited %d (%v); want 1\n%s", code, err, workerOut)
	}
	for _, line := range []string{": fence 4, owner " + w.name, "segment 1/2 refused FENCE_REGRESSION; stopping", "reported FENCE_REGRESSION on billing/", "released billing/"} {
		if !strings.Contains(workerOut, line) {
			t.Fatalf("the worker's report lacks %q:\n%s", line, workerOut)
		}
	}
	again4 := workerGrant(t, workerOut)

	// The store's alarm: two rows, the metric, the hook. Its highest fence
	// is still 4.
	alarms, err := pg.store.Alarms(ctx, batchKey)
	if err != nil {
		t.Fatal(err)
	}
	// (An alarm records the highest fence, its grant and root, not its
	// last sequence.)
	against := fencing.Ledger{Fence: highest.Fence, GrantUID: highest.GrantUID, Root: highest.Root}
	if len(alarms) != 2 ||
		alarms[0].Fence != 3 || alarms[0].GrantUID != string(again3.UID) || alarms[0].Highest != against ||
		alarms[1].Fence != 4 || alarms[1].GrantUID != string(again4.UID) || alarms[1].Highest != against {
		t.Fatalf("alarms = %+v; want fence 3 of %s and fence 4 of %s, both against %+v", alarms, again3.UID, again4.UID, against)
	}
	for _, a := range alarms {
		t.Logf("lockwarden_fence_alarms: resource=%s fence=%d grant=%s highest=%d/%s attempts=%d detail=%q", a.Resource, a.Fence, a.GrantUID, a.Highest.Fence, a.Highest.GrantUID, a.Attempts, a.Detail)
	}
	if n := pg.regressions(t); n != 1 {
		t.Fatalf("lockwarden_store_fence_regressions_total{resource=%q} = %v in this process's store; want 1", batchID, n)
	}
	if hooked := pg.hooked(); len(hooked) != 1 || hooked[0] != string(again3.UID) {
		t.Fatalf("the regression hook saw %v; want grant %s", hooked, again3.UID)
	}
	if got := pg.ledger(t); got != highest {
		t.Fatalf("ledger after the regressions = %+v; want it unchanged, %+v", got, highest)
	}

	// The alarm as the cluster shows it, for both grants: condition, Event,
	// and the manager's transition metric.
	for _, g := range []*lockingv1alpha1.LockGrant{again3, again4} {
		cur := waitGrant(t, g, "FenceRegression=True", func(g *lockingv1alpha1.LockGrant) bool {
			return meta.IsStatusConditionTrue(g.Status.Conditions, lockingv1alpha1.ConditionFenceRegression)
		})
		c := meta.FindStatusCondition(cur.Status.Conditions, lockingv1alpha1.ConditionFenceRegression)
		if c.Reason != lockingv1alpha1.LockGrantReasonFenceRegression || !strings.Contains(c.Message, "FENCE_REGRESSION") || !strings.Contains(c.Message, batchID) {
			t.Fatalf("grant %s condition %+v; want reason FENCE_REGRESSION and the store's message", g.Name, c)
		}
		t.Logf("grant %s (fence %d, %s): condition %s=%s reason=%s message=%q", g.Name, cur.Status.FenceToken, cur.Status.Phase, c.Type, c.Status, c.Reason, c.Message)
		ev := waitEvent(t, g, "FenceRegression")
		t.Logf("Event: type=%s reason=%s regarding=%s/%s note=%q", ev.Type, ev.Reason, ev.Regarding.Kind, ev.Regarding.Name, ev.Note)
	}
	// What an operator types (docs/segments.md).
	kubectlOut, err := cp.kubectl(ctx, nil, "-n", billing, "get", "events", "--field-selector", "reason=FenceRegression")
	if err != nil || !strings.Contains(string(kubectlOut), "lockgrant/"+again3.Name) || !strings.Contains(string(kubectlOut), "lockgrant/"+again4.Name) {
		t.Fatalf("kubectl get events --field-selector reason=FenceRegression: %v\n%s", err, kubectlOut)
	}
	t.Logf("kubectl -n %s get events --field-selector reason=FenceRegression:\n%s", billing, kubectlOut)
	kubectlOut, err = cp.kubectl(ctx, nil, "-n", billing, "get", "lockgrants", "-o",
		`custom-columns=NAME:.metadata.name,RESOURCE:.spec.resource,FENCE:.status.fenceToken,PHASE:.status.phase,REGRESSION:.status.conditions[?(@.type=="FenceRegression")].status`)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("kubectl -n %s get lockgrants -o custom-columns=...:\n%s", billing, kubectlOut)

	var lines []string
	waitUntil(t, `lockwarden_grant_transitions_total{reason="FENCE_REGRESSION"} is 2`, func(ctx context.Context) (bool, error) {
		v, l, err := manager.Metric(ctx, "lockwarden_grant_transitions_total", `reason="FENCE_REGRESSION"`)
		lines = l
		if v > 2 {
			return false, fmt.Errorf("the metric counts %v regressions, want 2: %v", v, l)
		}
		return err == nil && v == 2, nil
	})
	for _, l := range lines {
		if strings.Contains(l, "FENCE_REGRESSION") {
			t.Logf("manager /metrics: %s", l)
		}
	}

	// Recovery, as the runbook in docs/segments.md says.
	if out, err := cp.kubectl(ctx, nil, "patch", "fenceissuer", "default", "--type=merge", "-p", `{"spec":{"epoch":1,"revokedEpochs":[0]}}`); err != nil {
		t.Fatal(err)
	} else {
		t.Logf("kubectl: %s", oneLine(string(out)))
	}
	// The grant held across the restore ends Revoked; it can never renew
	// or write again.
	revoked := waitPhase(t, heldGrant, lockingv1alpha1.PhaseRevoked)
	if c := meta.FindStatusCondition(revoked.Status.Conditions, lockingv1alpha1.ConditionReady); c == nil || c.Reason != lockingv1alpha1.LockGrantReasonRevokedEpoch {
		t.Fatalf("Ready condition of the revoked grant = %+v; want reason RevokedEpoch", c)
	}
	wantReason(t, "renew of the grant held across the restore", renew(ctx, w, heldGrant), "REVOKED")
	// Its write is refused by the trust bundle's epochs before the grant
	// itself is judged.
	wantReason(t, "write of the grant held across the restore", guardedWrite(ctx, w, billing, heldObject, heldID, heldGrant, "late"), "REVOKED_EPOCH")

	// The next grant's fence is above everything issued before the restore:
	// the worker settles its batch now, starting with segment 1.
	workerOut, err = runWorker(t, w, dsn)
	if err != nil {
		t.Fatalf("the worker after the epoch bump: %v\n%s", err, workerOut)
	}
	next := int64(1)<<fencing.EpochBits | 1
	for _, line := range []string{fmt.Sprintf(": fence %d, owner", next), "segment 1/2 settled", "segment 2/2 settled", "batch " + batch + " settled"} {
		if !strings.Contains(workerOut, line) {
			t.Fatalf("the worker's report lacks %q:\n%s", line, workerOut)
		}
	}
	recovered := pg.ledger(t)
	if recovered.Fence != next || recovered.Fence <= highest.Fence || recovered.GrantUID != string(workerGrant(t, workerOut).UID) {
		t.Fatalf("ledger after the recovery = %+v; want fence %d of the worker's grant", recovered, next)
	}
	pg.wantSettled(t, map[int64]int{next: 4})
	pg.wantEffects(t, []string{"op-1/1@1", "op-2/1@2", "op-3/1@3", "op-4/1@4"})

	// New-epoch writes to the guarded objects are accepted; the grant held
	// across the restore is now also superseded.
	nextHeld := held(t, w, billing, heldID, 60)
	if nextHeld.Status.FenceToken != next {
		t.Fatalf("the next grant of %s has fence %d, want %d", heldID, nextHeld.Status.FenceToken, next)
	}
	if err := guardedWrite(ctx, w, billing, heldObject, heldID, nextHeld, "written in epoch 1"); err != nil {
		t.Fatalf("a write under the new epoch: %v", err)
	}
	wantReason(t, "write of the grant held across the restore, after a new-epoch write", guardedWrite(ctx, w, billing, heldObject, heldID, heldGrant, "late"), "REVOKED_EPOCH")
	wantReason(t, "renew of the grant held across the restore, later", renew(ctx, w, heldGrant), "REVOKED")
	if cm := configMap(t, billing, heldObject); cm.Data["result"] != "written in epoch 1" {
		t.Fatalf("guarded object %s = %v; want the new epoch's write", heldObject, cm.Data)
	}
	release(t, w, nextHeld)
}

// ledgerStore is the PostgreSQL side of the restore test: the store, with metrics and
// a regression hook, on a database that also holds the worker's tables.
type ledgerStore struct {
	db    *sql.DB
	store *postgres.Store
	reg   *prometheus.Registry
	w     *actor

	mu     sync.Mutex
	uids   []string
	report error
}

func newLedgerStore(t *testing.T, dsn string, w *actor) *ledgerStore {
	t.Helper()
	db, err := postgres.Open(dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	if err := postgres.Migrate(t.Context(), db); err != nil {
		t.Fatal(err)
	}
	// The test's own data: one row per applied segment.
	if _, err := db.ExecContext(t.Context(), `CREATE TABLE effects (root text, seq bigint, fence bigint)`); err != nil {
		t.Fatal(err)
	}
	s := &ledgerStore{db: db, reg: prometheus.NewRegistry(), w: w}
	metrics, err := postgres.NewMetrics(s.reg)
	if err != nil {
		t.Fatal(err)
	}
	s.store = postgres.New(db, kubeRegistry{c: admin}, postgres.WithCluster(cluster), postgres.WithMetrics(metrics), postgres.WithRegressionHook(s.onRegression))
	return s
}

// onRegression is what a holder does on FENCE_REGRESSION (as
// examples/settlement does): report it on its grant, in the annotation
// locking.lockwarden.io/fence-regression.
func (s *ledgerStore) onRegression(ctx context.Context, r *postgres.Refusal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.uids = append(s.uids, r.Segment.GrantUID)
	g, err := grantByUID(ctx, admin, billing, r.Segment.GrantUID)
	if err == nil {
		err = patchGrant(ctx, s.w, g, map[string]any{"metadata": map[string]any{
			"annotations": map[string]string{lockingv1alpha1.FenceRegressionAnnotation: r.Error()},
		}})
	}
	s.report = errors.Join(s.report, err)
}

func (s *ledgerStore) hooked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.uids...)
}

// grantAndWrite takes the next grant of batchID, wants fence, writes
// segment 1 of operation op-FENCE to PostgreSQL and the guarded ConfigMap,
// and releases the grant.
func (s *ledgerStore) grantAndWrite(t *testing.T, fence int64) *lockingv1alpha1.LockGrant {
	t.Helper()
	g := held(t, s.w, billing, batchID, 60)
	if g.Status.FenceToken != fence {
		t.Fatalf("grant %s has fence %d, want %d", g.Name, g.Status.FenceToken, fence)
	}
	seg := s.segment(g, fmt.Sprintf("op-%d", fence), 1)
	if res, err := s.apply(t.Context(), seg); err != nil || !res.Applied {
		t.Fatalf("segment under fence %d: %+v, %v; want applied", fence, res, err)
	}
	if err := guardedWrite(t.Context(), s.w, billing, batchObject, batchID, g, fmt.Sprintf("written under fence %d", fence)); err != nil {
		t.Fatalf("guarded write under fence %d: %v", fence, err)
	}
	if l := s.ledger(t); l.Fence != fence {
		t.Fatalf("ledger = %+v; want fence %d", l, fence)
	}
	return release(t, s.w, g)
}

func (s *ledgerStore) segment(g *lockingv1alpha1.LockGrant, root string, seq int64) postgres.Segment {
	return postgres.Segment{Namespace: billing, Resource: batchID, Caller: g.Spec.Owner, Fence: g.Status.FenceToken, GrantUID: string(g.UID),
		Root: root, Seq: seq, Payload: fmt.Appendf(nil, "%s/%d", root, seq)}
}

// apply writes seg with its effect: a row in the effects table.
func (s *ledgerStore) apply(ctx context.Context, seg postgres.Segment) (postgres.Result, error) {
	res, err := s.store.Apply(ctx, seg, func(ctx context.Context, tx *sql.Tx) error {
		_, err := tx.ExecContext(ctx, `INSERT INTO effects VALUES ($1, $2, $3)`, seg.Root, seg.Seq, seg.Fence)
		return err
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.report != nil {
		return res, fmt.Errorf("reporting the regression on the grant: %w", s.report)
	}
	return res, err
}

func (s *ledgerStore) ledger(t *testing.T) fencing.Ledger {
	t.Helper()
	l, err := s.store.Ledger(t.Context(), batchKey)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// regressions is lockwarden_store_fence_regressions_total{resource=batchID}.
func (s *ledgerStore) regressions(t *testing.T) float64 {
	t.Helper()
	mfs, err := s.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "lockwarden_store_fence_regressions_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "resource" && l.GetValue() == batchID {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	return 0
}

// wantEffects wants exactly these segments applied, once each, as
// "root/seq@fence".
func (s *ledgerStore) wantEffects(t *testing.T, want []string) {
	t.Helper()
	rows, err := s.db.QueryContext(t.Context(), `SELECT root, seq, fence FROM effects ORDER BY root, seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var root string
		var seq, fence int64
		if err := rows.Scan(&root, &seq, &fence); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s/%d@%d", root, seq, fence))
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("applied segments = %v; want %v", got, want)
	}
}

// wantSettled wants the worker's invoices settled under these fences, by
// count.
func (s *ledgerStore) wantSettled(t *testing.T, want map[int64]int) {
	t.Helper()
	rows, err := s.db.QueryContext(t.Context(), `SELECT fence, count(*) FROM settlement_invoices WHERE batch = $1 GROUP BY fence`, batch)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[int64]int{}
	for rows.Next() {
		var fence int64
		var n int
		if err := rows.Scan(&fence, &n); err != nil {
			t.Fatal(err)
		}
		got[fence] = n
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("settled invoices by fence = %v; want %v", got, want)
	}
}

// kubeRegistry answers the store's registry reads with direct reads from
// the API server (never a cache), as examples/settlement does.
type kubeRegistry struct {
	c client.Reader
}

var _ postgres.Registry = kubeRegistry{}

func (r kubeRegistry) GrantFacts(ctx context.Context, k postgres.Key, grantUID string) (*fencing.Grant, *fencing.Counter, error) {
	g, err := grantByUID(ctx, r.c, k.Namespace, grantUID)
	if err != nil && !apierrors.IsNotFound(err) {
		return nil, nil, err
	}
	c := &lockingv1alpha1.FenceCounter{}
	switch err := r.c.Get(ctx, client.ObjectKey{Namespace: k.Namespace, Name: lockingv1alpha1.FenceCounterName(k.Resource)}, c); {
	case apierrors.IsNotFound(err):
		c = nil
	case err != nil:
		return nil, nil, err
	}
	return facts.Grant(g), facts.Counter(c), nil
}

// grantByUID finds the grant of namespace ns with uid, with a direct list.
func grantByUID(ctx context.Context, c client.Reader, ns, uid string) (*lockingv1alpha1.LockGrant, error) {
	var list lockingv1alpha1.LockGrantList
	if err := c.List(ctx, &list, client.InNamespace(ns)); err != nil {
		return nil, err
	}
	for i := range list.Items {
		if string(list.Items[i].UID) == uid {
			return &list.Items[i], nil
		}
	}
	return nil, apierrors.NewNotFound(lockingv1alpha1.GroupVersion.WithResource("lockgrants").GroupResource(), uid)
}

// runWorker runs examples/settlement as w on the batch, and returns its
// output.
func runWorker(t *testing.T, w *actor, dsn string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, workerBin, "--kubeconfig", w.kubeconfig, "--cluster", cluster, "--namespace", billing, "--dsn", dsn,
		"--batch", batch, "--invoices", "4", "--segment-size", "2", "--ttl", "60", "--timeout", "60s")
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	cmd.WaitDelay = 10 * time.Second
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	err := cmd.Run()
	t.Logf("worker (exit %d):\n%s", exitCode(err), out.String())
	return out.String(), err
}

func exitCode(err error) int {
	var ee *exec.ExitError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &ee):
		return ee.ExitCode()
	}
	return -1
}

var workerHeldRE = regexp.MustCompile(`held (\S+)/(\S+) on `)

// workerGrant reads the grant the worker's report names.
func workerGrant(t *testing.T, out string) *lockingv1alpha1.LockGrant {
	t.Helper()
	m := workerHeldRE.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("the worker's report names no grant:\n%s", out)
	}
	g := &lockingv1alpha1.LockGrant{}
	if err := admin.Get(t.Context(), client.ObjectKey{Namespace: m[1], Name: m[2]}, g); err != nil {
		t.Fatal(err)
	}
	return g
}

// waitEvent waits for the Warning Event with reason about grant g.
func waitEvent(t *testing.T, g *lockingv1alpha1.LockGrant, reason string) *eventsv1.Event {
	t.Helper()
	var found *eventsv1.Event
	waitUntil(t, "a Warning Event "+reason+" about grant "+g.Name, func(ctx context.Context) (bool, error) {
		var list eventsv1.EventList
		if err := admin.List(ctx, &list, client.InNamespace(g.Namespace)); err != nil {
			return false, nil
		}
		for i := range list.Items {
			e := &list.Items[i]
			if e.Regarding.UID == g.UID && e.Reason == reason && e.Type == corev1.EventTypeWarning {
				found = e
				return true, nil
			}
		}
		return false, nil
	})
	return found
}
