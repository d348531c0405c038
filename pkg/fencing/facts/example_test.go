package facts_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// A service outside the cluster that accepts a write to its resource only
// from the current holder of the resource's grant. The caller sends its
// service account token (Authorization: Bearer), the grant's proof and its
// fence; the service
//
//  1. authenticates the caller with the API server's TokenReview (the
//     identity then has to be the record's owner),
//  2. reads the grant and the counter the proof names, directly from the API
//     server,
//  3. checks the proof against the trust bundle exported from the cluster
//     (kubectl get configmap lockwarden-trust-bundle, see docs/signing.md) and
//     every liveness and fence rule, and
//  4. records the accepted fence with its data, so that an older fence is
//     refused afterwards even if the registry is restored from a backup.
//
// Its service account needs create on tokenreviews and get on lockgrants
// and fencecounters.
func Example_verifierService() {
	scheme := runtime.NewScheme()
	_ = clientgoscheme.AddToScheme(scheme)
	_ = lockingv1alpha1.AddToScheme(scheme)
	c, err := client.New(ctrl.GetConfigOrDie(), client.Options{Scheme: scheme}) // no cache: reads are linearizable
	if err != nil {
		panic(err)
	}
	raw, err := os.ReadFile("trust-bundle.json")
	if err != nil {
		panic(err)
	}
	bundle, err := fencing.ParseTrustBundle(raw)
	if err != nil {
		panic(err)
	}

	const resource = "exports/nightly" // the resource ID this service guards
	var mu sync.Mutex
	var recorded int64 // in a real service: stored in the same transaction as the data

	http.HandleFunc("/write", func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		caller, err := authenticate(ctx, c, r)
		if err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		proof := fencing.Proof(r.Header.Get("Lockwarden-Proof"))
		rec, _, err := fencing.ParseProof(proof)
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		fence, err := fencing.ParseFence(r.Header.Get("Lockwarden-Fence"))
		if err != nil {
			http.Error(w, err.Error(), http.StatusForbidden)
			return
		}
		grant, counter, err := facts.ReadRegistry(ctx, c, rec.Namespace, rec.Grant, resource)
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable) // fail closed
			return
		}
		mu.Lock()
		defer mu.Unlock()
		err = fencing.CheckProvenWrite(fencing.ProvenWrite{
			Proof: proof, Bundle: bundle, GrantNamespace: rec.Namespace, GrantName: rec.Grant,
			Write: fencing.Write{Resource: resource, Caller: caller, Fence: fence, Recorded: recorded,
				Grant: grant, Counter: counter, Now: time.Now()},
		})
		var refusal *fencing.Error
		if errors.As(err, &refusal) {
			// The reason code first, as every lockwarden refusal.
			http.Error(w, refusal.Error(), http.StatusConflict)
			return
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		recorded = fence
		// ... apply the write here, under mu, with the fence stored beside it.
		_ = json.NewEncoder(w).Encode(map[string]any{"accepted": fence})
	})
	fmt.Println(http.ListenAndServe(":8080", nil))
}

// authenticate returns the Kubernetes user name of the caller's bearer
// token, as the API server's TokenReview says.
func authenticate(ctx context.Context, c client.Client, r *http.Request) (string, error) {
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return "", errors.New("no bearer token")
	}
	tr := &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}
	if err := c.Create(ctx, tr); err != nil {
		return "", fmt.Errorf("reviewing the token: %w", err)
	}
	if !tr.Status.Authenticated {
		return "", errors.New("the token is not valid")
	}
	return tr.Status.User.Username, nil
}
