package plugin

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/denial"
)

// spentUntil waits until the ledger of ns records request ID id, after its
// grant was deleted, and returns the end of the ID's window.
func spentUntil(t *testing.T, ns, id string) time.Time {
	t.Helper()
	grant := types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.GrantNameForRequest(id)}
	eventually(t, 30*time.Second, "the ended grant of "+id+" is deleted", func() bool {
		return apierrors.IsNotFound(admin.Get(t.Context(), grant, &lockingv1alpha1.LockGrant{}))
	})
	var l lockingv1alpha1.RequestIDLedger
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: lockingv1alpha1.RequestIDLedgerName}, &l); err != nil {
		t.Fatalf("the grant of %s was deleted, but the ledger: %v", id, err)
	}
	for _, e := range l.Spec.Entries {
		if e.RequestID == id {
			return e.SpentUntil.Time
		}
	}
	t.Fatalf("the grant of %s was deleted without its request ID in the ledger: %+v", id, l.Spec.Entries)
	return time.Time{}
}

// A request ID stays spent for the registry's window after its grant ended,
// whether or not the grant is still kept: a retried `run` never runs its
// command twice within the window. Past it, the run is a new attempt, and
// the user is told so.
func TestRequestIDStaysSpentAfterItsGrantIsDeleted(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const res, id = "inv/4r", "nightly-2026-12-03"
	run := func(what string) (int, string, string) {
		return kubectlLockOK(t, "alice", "-n", ns, "run", res, "--request-id", id, "--ttl", "10s", "--", "sh", "-c", "echo "+what)
	}
	if code, out, errOut := run("first"); code != 0 || out != "first\n" {
		t.Fatalf("the first run exited %d and printed %q: %s", code, out, errOut)
	}
	// While the ended grant is kept, and after it is deleted: refused,
	// with the reason it ended, and the command does not run.
	if code, out, errOut := run("again"); code != 3 || out != "" || !strings.Contains(errOut, "ALREADY_ENDED") {
		t.Fatalf("a retry while the grant is kept exited %d and printed %q, want 3 ALREADY_ENDED: %s", code, out, errOut)
	}
	until := spentUntil(t, ns, id)
	if code, out, errOut := run("LATE"); code != 3 || out != "" || !strings.Contains(errOut, "ALREADY_ENDED") || !strings.Contains(errOut, "is spent") {
		t.Fatalf("a retry after the grant was deleted exited %d and printed %q, want 3 ALREADY_ENDED (spent): %s", code, out, errOut)
	}
	// Past the window, a run with the ID is a new attempt: told so.
	eventually(t, requestIDWindow+10*time.Second, "the request ID's window passes", func() bool { return time.Now().After(until.Add(time.Second)) })
	code, out, errOut := run("anew")
	if code != 0 || out != "anew\n" || !strings.Contains(errOut, "Warning:") || !strings.Contains(errOut, "new attempt") {
		t.Fatalf("a run past the window exited %d and printed %q, want 0, the command's output and a warning on stderr: %q", code, out, errOut)
	}
}

// acquire prints what a later renew or release needs (the grant's UID) and
// takes -o jsonpath as status does. A renew or release that names an
// acquisition by UID never touches another one that has the name, and says
// that acquisition does not exist; one by name alone refuses a grant the
// caller cannot have seen: one made with a request ID after the grant that
// spent it ended.
func TestReleaseByNameNeverReachesALaterGrant(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const res, id = "reports/weekly", "weekly-2026-49"
	code, out, errOut := kubectlLockOK(t, "alice", "-n", ns, "acquire", res, "--request-id", id, "--ttl", "30s")
	var name, expires, uid string
	var fence int64
	if n, err := fmt.Sscanf(out, "grant %s fence %d expires %s uid %s\n", &name, &fence, &expires, &uid); code != 0 || err != nil || n != 4 {
		t.Fatalf("acquire exited %d and printed %q (%v), want the grant, its fence, expiry and UID: %s", code, out, err, errOut)
	}
	// The same request again prints the same grant, -o jsonpath as status.
	code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "acquire", res, "--request-id", id, "--ttl", "30s", "-o", "jsonpath={.metadata.name} {.metadata.uid} {.status.fenceToken}")
	if want := fmt.Sprintf("%s %s %d", name, uid, fence); code != 0 || out != want {
		t.Fatalf("acquire -o jsonpath exited %d and printed %q, want %q: %s", code, out, want, errOut)
	}
	if code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "release", name, "--uid", uid); code != 0 || !strings.Contains(out, "released") {
		t.Fatalf("release --uid exited %d: %s %s", code, out, errOut)
	}

	// The request ID's window passes; acquiring with it again makes a
	// later acquisition with the same name.
	until := spentUntil(t, ns, id)
	eventually(t, requestIDWindow+10*time.Second, "the request ID's window passes", func() bool { return time.Now().After(until.Add(time.Second)) })
	code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "acquire", res, "--request-id", id, "--ttl", "30s", "-o", "jsonpath={.metadata.uid}")
	later := out
	if code != 0 || later == "" || later == uid || !strings.Contains(errOut, "Warning:") {
		t.Fatalf("acquire past the window exited %d and printed %q (the first acquisition was %s), want a new acquisition and a warning: %s", code, later, uid, errOut)
	}
	for _, verb := range []string{"renew", "release"} {
		// By the earlier UID: that acquisition does not exist.
		code, _, errOut = kubectlLockOK(t, "alice", "-n", ns, verb, name, "--uid", uid)
		if code != 3 || !strings.Contains(errOut, "UNKNOWN_GRANT") || !strings.Contains(errOut, "acquisition "+uid+" of grant") || !strings.Contains(errOut, later) {
			t.Fatalf("%s --uid of the earlier acquisition exited %d, want 3 UNKNOWN_GRANT saying that acquisition does not exist: %s", verb, code, errOut)
		}
		// By name alone: not the later grant, which the caller cannot
		// have seen under this name.
		code, _, errOut = kubectlLockOK(t, "alice", "-n", ns, verb, name)
		if code != 3 || !strings.Contains(errOut, "UNKNOWN_GRANT") || !strings.Contains(errOut, "--uid "+later) {
			t.Fatalf("%s by name of the later grant exited %d, want 3 UNKNOWN_GRANT naming its --uid: %s", verb, code, errOut)
		}
	}
	var g lockingv1alpha1.LockGrant
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &g); err != nil || string(g.UID) != later ||
		g.Status.Phase != lockingv1alpha1.PhaseHeld || g.Spec.Release || g.Spec.Renewals != 0 {
		t.Fatalf("the later grant was touched: %v %+v %+v", err, g.Spec, g.Status)
	}
	// The same request again finds that grant (AlreadyExists after
	// admission): no warning of a new attempt, since none is made.
	code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "acquire", res, "--request-id", id, "--ttl", "30s", "-o", "jsonpath={.metadata.uid}")
	if code != 0 || out != later || strings.Contains(errOut, "Warning:") {
		t.Fatalf("acquire of the new attempt's request ID again exited %d and printed %q, want %s and no warning: %s", code, out, later, errOut)
	}
	if code, out, errOut = kubectlLockOK(t, "alice", "-n", ns, "release", name, "--uid", later); code != 0 || !strings.Contains(out, "released") {
		t.Fatalf("release --uid of the later grant exited %d: %s %s", code, out, errOut)
	}
}

// A user who deletes an ended grant of a request ID they chose, before the
// manager recorded the ID as spent, is refused REQUEST_ID_LIVE and the grant
// stays: deleted, it would take the ID with it, and a retried run would run
// its command again. The manager records the ID and deletes the grant when
// its retention ends; the retry is refused before and after.
func TestEndedGrantOfARequestIDIsDeletedOnlyOnceRecorded(t *testing.T) {
	t.Parallel()
	ns := namespace(t)
	const res, id = "inv/5r", "nightly-2026-12-04"
	run := func(what string) (int, string, string) {
		return kubectlLockOK(t, "alice", "-n", ns, "run", res, "--request-id", id, "--ttl", "10s", "--", "sh", "-c", "echo "+what)
	}
	if code, out, errOut := run("first"); code != 0 || out != "first\n" {
		t.Fatalf("the first run exited %d and printed %q: %s", code, out, errOut)
	}
	name := lockingv1alpha1.GrantNameForRequest(id)
	for _, user := range []string{"alice", "bob"} {
		del := exec.Command(filepath.Join(binDir, "kubectl"), "delete", "lockgrant", name, "-n", ns)
		del.Env = append(os.Environ(), "KUBECONFIG="+kubeconfigs[user])
		out, err := del.CombinedOutput()
		if err == nil || !strings.Contains(string(out), "REQUEST_ID_LIVE") || !strings.Contains(string(out), id) {
			t.Fatalf("%s's delete of the ended grant before its ID was recorded: %v: %s; want it refused REQUEST_ID_LIVE naming the ID", user, err, out)
		}
	}
	// An administrator fares no better: a deletecollection of the
	// namespace's grants, a dry run, a delete with preconditions, nor a
	// delete after marking the ID generated (immutable, whatever the
	// patch) or a server-side apply without the request ID under another
	// field manager.
	target := func() *lockingv1alpha1.LockGrant {
		return &lockingv1alpha1.LockGrant{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	var cur lockingv1alpha1.LockGrant
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &cur); err != nil {
		t.Fatal(err)
	}
	for what, del := range map[string]func() error{
		"deletecollection": func() error {
			return admin.DeleteAllOf(t.Context(), &lockingv1alpha1.LockGrant{}, client.InNamespace(ns))
		},
		"dry run": func() error { return admin.Delete(t.Context(), target(), client.DryRunAll) },
		"with preconditions": func() error {
			return admin.Delete(t.Context(), target(), client.Preconditions{UID: &cur.UID, ResourceVersion: &cur.ResourceVersion})
		},
	} {
		if err := del(); denial.Reason(err) != fencing.ReasonRequestIDLive {
			t.Errorf("the administrator's delete (%s) of the ended grant before its ID was recorded: %v; want REQUEST_ID_LIVE", what, err)
		}
	}
	for what, p := range map[string]client.Patch{
		"merge": client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"annotations":{"locking.lockwarden.io/generated-request-id":"true"}}}`)),
		"json":  client.RawPatch(types.JSONPatchType, []byte(`[{"op":"add","path":"/metadata/annotations/locking.lockwarden.io~1generated-request-id","value":"true"}]`)),
		"apply": client.RawPatch(types.ApplyPatchType, []byte(fmt.Sprintf(`{"apiVersion":"locking.lockwarden.io/v1alpha1","kind":"LockGrant","metadata":{"name":%q,"namespace":%q,"annotations":{"locking.lockwarden.io/generated-request-id":"true"}}}`, name, ns))),
	} {
		opts := []client.PatchOption{}
		if what == "apply" {
			opts = append(opts, client.FieldOwner("mallory-apply"), client.ForceOwnership)
		}
		if err := admin.Patch(t.Context(), target(), p, opts...); err == nil {
			t.Errorf("the administrator's %s patch marking the ended grant's request ID generated was accepted", what)
		}
	}
	var g lockingv1alpha1.LockGrant
	if err := admin.Get(t.Context(), types.NamespacedName{Namespace: ns, Name: name}, &g); err != nil || g.Status.Phase != lockingv1alpha1.PhaseReleased ||
		g.UID != cur.UID || g.Annotations[lockingv1alpha1.GeneratedRequestIDAnnotation] != "" {
		t.Fatalf("the ended grant after the refused deletes: %v, phase %q, annotations %v", err, g.Status.Phase, g.Annotations)
	}
	if code, out, errOut := run("AGAIN"); code != 3 || out != "" || !strings.Contains(errOut, "ALREADY_ENDED") {
		t.Fatalf("a retry while the grant is kept exited %d and printed %q, want 3 ALREADY_ENDED: %s", code, out, errOut)
	}
	// The manager records the ID, then deletes the grant (spentUntil
	// fails if it was deleted unrecorded); the retry is still refused.
	spentUntil(t, ns, id)
	if code, out, errOut := run("LATE"); code != 3 || out != "" || !strings.Contains(errOut, "is spent") {
		t.Fatalf("a retry after the grant was deleted exited %d and printed %q, want 3 ALREADY_ENDED (spent): %s", code, out, errOut)
	}
}
