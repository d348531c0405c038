package facts_test

import (
	"context"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/lockwarden/lockwarden/pkg/fencing/facts"
)

// namespaces reads namespaces by name and counts the reads.
type namespaces struct {
	byName map[string]*corev1.Namespace
	reads  *int
}

func (n namespaces) Get(_ context.Context, key client.ObjectKey, obj client.Object, _ ...client.GetOption) error {
	*n.reads++
	ns, ok := n.byName[key.Name]
	if !ok {
		return apierrors.NewNotFound(schema.GroupResource{Resource: "namespaces"}, key.Name)
	}
	ns.DeepCopyInto(obj.(*corev1.Namespace))
	return nil
}

func (namespaces) List(context.Context, client.ObjectList, ...client.ListOption) error { return nil }

func TestNamespaceTerminating(t *testing.T) {
	gone := metav1.Now()
	reads := 0
	r := namespaces{reads: &reads, byName: map[string]*corev1.Namespace{
		"billing":     {ObjectMeta: metav1.ObjectMeta{Name: "billing"}},
		"terminating": {ObjectMeta: metav1.ObjectMeta{Name: "terminating", DeletionTimestamp: &gone}},
	}}
	cases := []struct {
		name  string
		want  bool
		errs  bool
		reads int
	}{
		{"billing", false, false, 1},
		{"terminating", true, false, 1},
		{"missing", false, true, 1},
		{"", false, false, 0}, // a cluster-scoped object: no read
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reads = 0
			got, err := facts.NamespaceTerminating(context.Background(), r, c.name)
			if got != c.want || (err != nil) != c.errs || reads != c.reads {
				t.Fatalf("got %v, %v after %d reads; want %v, error %v, %d reads", got, err, reads, c.want, c.errs, c.reads)
			}
		})
	}
}
