package gated

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/lockwarden/lockwarden/internal/test/envtest"
)

var (
	env *envtest.Env
	// admin is a client with cluster-admin rights; in envtest the manager
	// runs as the same identity.
	admin client.WithWatch
	// clk is the controller's and the webhooks' clock.
	clk *clocktesting.FakeClock
)

func TestMain(m *testing.M) {
	clk = clocktesting.NewFakeClock(time.Date(2026, 7, 19, 0, 0, 0, 0, time.UTC))
	envtest.Main(m, envtest.Suite{
		Clock: clk,
		Setup: func(_ context.Context, e *envtest.Env) error {
			env, admin = e, e.Admin
			return installPolicies(filepath.Join(e.Root, "config", "webhook", "manifests.yaml"))
		},
	})
}

// installPolicies creates the ValidatingAdmissionPolicies and their
// bindings of the webhook manifests, which envtest's webhook installer
// leaves out.
func installPolicies(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	for _, doc := range strings.Split(string(raw), "\n---\n") {
		u := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
			return err
		}
		if k := u.GetKind(); k != "ValidatingAdmissionPolicy" && k != "ValidatingAdmissionPolicyBinding" {
			continue
		}
		if err := admin.Create(context.Background(), u); err != nil {
			return fmt.Errorf("creating %s %s: %w", u.GetKind(), u.GetName(), err)
		}
	}
	return nil
}
