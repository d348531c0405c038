package lock_test

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/deny"
	"github.com/lockwarden/lockwarden/internal/testenv"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/lock"
	"github.com/lockwarden/lockwarden/pkg/lock/holder"
)

var lockGrants = schema.GroupResource{Group: lockingv1alpha1.GroupVersion.Group, Resource: "lockgrants"}

// admissionRefusal is what the API server returns when lockwarden's
// admission refuses a request with reason r.
func admissionRefusal(r fencing.Reason, name string) error {
	return deny.Error(&fencing.Error{Reason: r, Detail: "refused by the test"}, lockGrants, name)
}

// One live holder per grant: a second process that uses the same request
// ID while the first holds the grant is refused DRIVER_MISMATCH and gets
// no lock; it cannot renew the first one's grant either; the first keeps
// holding and renewing. Once the grant ended, the request ID is spent.
func TestOneLiveHolderPerRequestID(t *testing.T) {
	ns := namespace(t)
	const res, rid = "b10/r2", "nightly-job"
	first, err := newTestClient(t, as(t, "one-a"), lock.WithNamespace(ns)).Acquire(t.Context(), res, lock.WithRequestID(rid), lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := first.AwaitRecord(t.Context()); err != nil {
		t.Fatal(err)
	}
	second := newTestClient(t, as(t, "one-a"), lock.WithNamespace(ns))
	h, err := second.Acquire(t.Context(), res, lock.WithRequestID(rid), lock.WithTTL(30*time.Second))
	if h != nil || !errors.Is(err, fencing.ErrDriverMismatch) || fencing.ReasonOf(err) != fencing.ReasonDriverMismatch {
		t.Fatalf("second Acquire with the same request ID: %v, %v; want no handle and DRIVER_MISMATCH", h, err)
	}
	if !strings.Contains(err.Error(), "another process") {
		t.Errorf("the refusal does not say why: %v", err)
	}
	if _, err := second.Renew(t.Context(), first.Info().Grant, first.Info().UID); !errors.Is(err, fencing.ErrDriverMismatch) {
		t.Fatalf("second process renewing the first one's grant: %v, want DRIVER_MISMATCH", err)
	}
	// TryAcquire is refused the same way.
	if _, err := second.TryAcquire(t.Context(), res, lock.WithRequestID(rid)); !errors.Is(err, fencing.ErrDriverMismatch) {
		t.Fatalf("second TryAcquire: %v, want DRIVER_MISMATCH", err)
	}
	g := grantOf(t, first.Info().Grant)
	if err := checkErr(first); err != nil || g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Spec.Renewals != 0 || g.Spec.Release {
		t.Fatalf("the first holder after the second's attempts: Check %v, phase %s, renewals %d, release %v", err, g.Status.Phase, g.Spec.Renewals, g.Spec.Release)
	}
	release(t, first, "")
	_, err = second.Acquire(t.Context(), res, lock.WithRequestID(rid))
	if !errors.Is(err, fencing.ErrAlreadyEnded) || errors.Is(err, lock.ErrLost) || !strings.Contains(err.Error(), "spent") {
		t.Fatalf("Acquire with a spent request ID: %v, want ALREADY_ENDED saying the ID is spent", err)
	}
}

// A handle's renewals and releases carry its session as a precondition: a
// session token written onto the grant by another driver makes the handle
// stop (ErrLost, DRIVER_MISMATCH) instead of renewing alongside it.
func TestSecondDriverStopsTheHandle(t *testing.T) {
	ns := namespace(t)
	hclk := newHandleClock()
	c := as(t, "drv-a")
	h, err := newTestClient(t, c, lock.WithNamespace(ns), lock.WithClock(hclk)).Acquire(t.Context(), "b10/drv", lock.WithTTL(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	patchAnnotation(t, h.Info().Grant, lockingv1alpha1.DriverAnnotation, "another-session-token-0123456789")
	hclk.Step(11 * time.Second) // the renew is due
	eventually(t, "the handle stops", func() bool { return closed(h.Context().Done()) })
	if err := context.Cause(h.Context()); !errors.Is(err, lock.ErrLost) || !errors.Is(err, fencing.ErrDriverMismatch) {
		t.Fatalf("cause = %v, want ErrLost and DRIVER_MISMATCH", err)
	}
	if g := grantOf(t, h.Info().Grant); g.Spec.Renewals != 0 {
		t.Fatalf("the handle renewed a grant another session drives: renewals %d", g.Spec.Renewals)
	}
	if err := h.Release(t.Context()); !errors.Is(err, fencing.ErrDriverMismatch) {
		t.Fatalf("Release: %v, want DRIVER_MISMATCH", err)
	}
}

// Every refusal of a renew ends the handle, and its cause matches the
// refusal's sentinel and reason code; NOT_HELD alone does not end it.
func TestRenewRefusalsEndTheHandle(t *testing.T) {
	for _, r := range []fencing.Reason{
		fencing.ReasonRevoked, fencing.ReasonExpired, fencing.ReasonNotOwner, fencing.ReasonAlreadyEnded,
		fencing.ReasonStaleOwner, fencing.ReasonUnknownGrant, fencing.ReasonRevokedEpoch, fencing.ReasonFenceRegression,
	} {
		t.Run(string(r), func(t *testing.T) {
			ns := namespace(t)
			hclk := newHandleClock()
			fa := &faulty{WithWatch: as(t, "ref-a")}
			h, err := newTestClient(t, fa, lock.WithNamespace(ns), lock.WithClock(hclk)).Acquire(t.Context(), "b10/refused", lock.WithTTL(30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			fa.mu.Lock()
			fa.refuseRenews = admissionRefusal(r, h.Info().Grant.Name)
			fa.mu.Unlock()
			hclk.Step(11 * time.Second)
			eventually(t, "the handle ends", func() bool { return closed(h.Context().Done()) && h.State().Final() })
			err = context.Cause(h.Context())
			if !errors.Is(err, lock.ErrLost) || !errors.Is(err, r.Sentinel()) || fencing.ReasonOf(err) != r {
				t.Fatalf("cause = %v; want ErrLost matching %s", err, r)
			}
			if err := checkErr(h); !errors.Is(err, r.Sentinel()) {
				t.Fatalf("Check = %v, want %s", err, r)
			}
		})
	}
}

// Release reports every refusal as an error matching its sentinel, the
// same way Renew does; a refusal that is not lockwarden's (RBAC) comes back
// at once, without retrying until the context ends.
func TestReleaseRefusalsMatch(t *testing.T) {
	ns := namespace(t)
	for _, r := range []fencing.Reason{fencing.ReasonExpired, fencing.ReasonNotOwner, fencing.ReasonRevoked, fencing.ReasonAlreadyEnded} {
		fa := &faulty{WithWatch: as(t, "relref-a")}
		h, err := newTestClient(t, fa, lock.WithNamespace(ns)).Acquire(t.Context(), "b10/rel-"+strings.ToLower(strings.ReplaceAll(string(r), "_", "-")))
		if err != nil {
			t.Fatal(err)
		}
		fa.refuseReleases = admissionRefusal(r, h.Info().Grant.Name)
		err = h.Release(t.Context())
		if !errors.Is(err, r.Sentinel()) || fencing.ReasonOf(err) != r || !apierrors.IsForbidden(err) {
			t.Fatalf("%s: Release = %v, want the refusal matching %s", r, err, r)
		}
		if !h.State().Final() {
			t.Fatalf("%s: state %s after a refused release, want final", r, h.State())
		}
	}

	fa := &faulty{WithWatch: as(t, "relref-a")}
	h, err := newTestClient(t, fa, lock.WithNamespace(ns)).Acquire(t.Context(), "b10/rel-rbac")
	if err != nil {
		t.Fatal(err)
	}
	fa.refuseReleases = apierrors.NewForbidden(lockGrants, h.Info().Grant.Name, errors.New(`User "relref-a" cannot patch resource "lockgrants"`))
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	err = h.Release(ctx)
	if !apierrors.IsForbidden(err) || fencing.ReasonOf(err) != "" || time.Since(start) > 5*time.Second {
		t.Fatalf("release refused by RBAC: %v after %s; want the Forbidden error at once", err, time.Since(start))
	}
	fa.refuseReleases = nil
	release(t, h, "")
}

// Renew and Release of an acquisition that does not exist answer alike:
// UNKNOWN_GRANT; both need the exact acquisition (its UID).
func TestRenewReleaseNonexistent(t *testing.T) {
	ns := namespace(t)
	locks := newTestClient(t, as(t, "none-a"), lock.WithNamespace(ns))
	key := types.NamespacedName{Namespace: ns, Name: "nonexistent"}
	_, rerr := locks.Renew(t.Context(), key, "0d4f0a8e-0000-4000-8000-000000000000")
	lerr := locks.Release(t.Context(), key, "0d4f0a8e-0000-4000-8000-000000000000")
	for name, err := range map[string]error{"renew": rerr, "release": lerr} {
		if !errors.Is(err, fencing.ErrUnknownGrant) || fencing.ReasonOf(err) != fencing.ReasonUnknownGrant {
			t.Errorf("%s of a grant that does not exist: %v, want UNKNOWN_GRANT", name, err)
		}
	}
	if _, err := locks.Renew(t.Context(), key, ""); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("Renew without a UID: %v, want ErrInvalidOption", err)
	}
	if err := locks.Release(t.Context(), key, ""); !errors.Is(err, lock.ErrInvalidOption) {
		t.Errorf("Release without a UID: %v, want ErrInvalidOption", err)
	}
}

// An Acquire whose create landed but whose reply was lost, and whose grant
// expired before the retry found it, says the grant ended before it was
// confirmed (EXPIRED), not that ownership was lost: it never held anything.
func TestAcquireOfAGrantThatExpiredMeanwhile(t *testing.T) {
	ns := namespace(t)
	const rid = "expired-meanwhile"
	fa := &faulty{WithWatch: as(t, "exp-a"), loseCreateReplies: 1}
	key := keyOf(ns, rid)
	fa.afterCreate = func() {
		waitPhase(t, key, lockingv1alpha1.PhaseHeld)
		clk.Step(3 * time.Second)
		wake(t, key)
		waitPhase(t, key, lockingv1alpha1.PhaseExpired)
	}
	h, err := newTestClient(t, fa, lock.WithNamespace(ns)).Acquire(t.Context(), "b10/exp", lock.WithRequestID(rid), lock.WithTTL(2*time.Second))
	if h != nil || !errors.Is(err, fencing.ErrExpired) || errors.Is(err, lock.ErrLost) || strings.Contains(err.Error(), "ownership lost") {
		t.Fatalf("Acquire = %v, %v; want EXPIRED without 'ownership lost'", h, err)
	}
}

// A create refused by admission matches its fencing sentinel too.
func TestCreateRefusalMatches(t *testing.T) {
	ns := namespace(t)
	fa := &faulty{WithWatch: as(t, "create-a")}
	// An identity that is not a GuardPolicy's holder is refused NOT_OWNER;
	// reproduce the refusal the webhook sends for it.
	_, err := newTestClient(t, &refusingCreates{faulty: fa, err: admissionRefusal(fencing.ReasonNotOwner, "x")}, lock.WithNamespace(ns)).
		Acquire(t.Context(), "b10/create")
	if !errors.Is(err, fencing.ErrNotOwner) || fencing.ReasonOf(err) != fencing.ReasonNotOwner {
		t.Fatalf("Acquire refused at create: %v, want NOT_OWNER", err)
	}
}

// A logger set with WithLogger gets the library's logs.
func TestWithLogger(t *testing.T) {
	ns := namespace(t)
	var lines []string
	var mu = make(chan struct{}, 1)
	mu <- struct{}{}
	l := funcLogger(func(msg string) { <-mu; lines = append(lines, msg); mu <- struct{}{} })
	h, err := newTestClient(t, as(t, "log-a"), lock.WithNamespace(ns), lock.WithLogger(l)).Acquire(t.Context(), "b10/log")
	if err != nil {
		t.Fatal(err)
	}
	release(t, h, "")
	<-mu
	defer func() { mu <- struct{}{} }()
	if !strings.Contains(strings.Join(lines, "\n"), "Lock state changed") {
		t.Fatalf("the logger got %q", lines)
	}
}

// newHandleClock is a fake clock for a handle, set to the controller's.
func newHandleClock() *clocktesting.FakeClock { return clocktesting.NewFakeClock(clk.Now()) }

// patchAnnotation sets an annotation on a grant as admin.
func patchAnnotation(t *testing.T, key types.NamespacedName, k, v string) {
	t.Helper()
	body := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, k, v)
	g := &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: key.Namespace, Name: key.Name}}
	if err := admin.Patch(t.Context(), g, client.RawPatch(types.MergePatchType, []byte(body))); err != nil {
		t.Fatal(err)
	}
}

// refusingCreates refuses every create with err.
type refusingCreates struct {
	*faulty
	err error
}

func (r *refusingCreates) Create(context.Context, client.Object, ...client.CreateOption) error {
	return r.err
}

// funcLogger logs every line, V(1) included, to fn.
func funcLogger(fn func(string)) logr.Logger {
	return funcr.New(func(prefix, args string) { fn(prefix + " " + args) }, funcr.Options{Verbosity: 1})
}

// A client whose transport checks its connections' health works like any
// other: the TLS settings moved into the transport, impersonation stayed.
func TestConfigureTransport(t *testing.T) {
	ns := namespace(t)
	rc := rest.CopyConfig(cfg)
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:billing:transport-a", Groups: []string{"system:serviceaccounts"}}
	hc, err := lock.ConfigureTransport(rc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(hc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newTestClient(t, c, lock.WithNamespace(ns)).Acquire(t.Context(), "b10/transport")
	if err != nil {
		t.Fatal(err)
	}
	if h.Info().Owner != "system:serviceaccount:billing:transport-a" {
		t.Fatalf("owner %q: impersonation lost", h.Info().Owner)
	}
	release(t, h, "")
	if _, err := lock.ConfigureTransport(hc); !errors.Is(err, lock.ErrInvalidOption) {
		t.Fatalf("a config with its own transport: %v, want ErrInvalidOption", err)
	}
}

// After a partition heals, a handle whose connection died in it learns its
// grant's fate within a few seconds: ConfigureTransport's health checks
// close the dead connection during the partition, so that nothing waits
// for it afterwards.
func TestPartitionHealSettlesQuickly(t *testing.T) {
	ns := namespace(t)
	u, err := url.Parse(cfg.Host)
	if err != nil {
		t.Fatal(err)
	}
	px, err := testenv.StartProxy(u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer px.Close()
	rc := rest.CopyConfig(cfg)
	rc.Host = "https://" + px.Addr()
	rc.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:billing:heal-a", Groups: []string{"system:serviceaccounts"}}
	hc, err := lock.ConfigureTransport(rc)
	if err != nil {
		t.Fatal(err)
	}
	c, err := client.NewWithWatch(hc, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	h, err := newTestClient(t, c, lock.WithNamespace(ns)).Acquire(t.Context(), "b10/heal", lock.WithTTL(4*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	px.Partition()
	eventually(t, "ownership becomes unknown", func() bool { return errors.Is(context.Cause(h.Context()), lock.ErrOwnershipUnknown) })
	// The controller expires the grant meanwhile.
	clk.Step(5 * time.Second)
	wake(t, h.Info().Grant)
	waitPhase(t, h.Info().Grant, lockingv1alpha1.PhaseExpired)
	// The health checks find the connection dead and the client dials
	// again, during the partition.
	eventually(t, "the client gives up its dead connection", func() bool { return px.Refused() > 0 })
	px.Heal()
	healed := time.Now()
	eventually(t, "the handle reads that its grant expired", func() bool { return h.State() == holder.Expired })
	if took := time.Since(healed); took > 3*time.Second {
		t.Fatalf("OWNERSHIP_UNKNOWN settled %s after the heal, want within 3 s", took)
	}
	t.Logf("settled %s after the heal", time.Since(healed))
	_ = h.Release(t.Context())
}
