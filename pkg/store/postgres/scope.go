package postgres

import (
	"fmt"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// Scope names who issued a resource's fences. Fences increase per cluster,
// namespace and resource ID: a FenceCounter lives in the namespace of its
// grants, and two clusters (two lockwarden installations) issue fences
// independently. Every record of the store is keyed by the scope and the
// resource ID together, so the same resource ID in two namespaces or two
// clusters has two independent ledgers.
type Scope struct {
	// Cluster names the lockwarden installation that issued the fences:
	// the store's WithCluster.
	Cluster string
	// Namespace is the namespace the resource ID is scoped to: the
	// namespace of the LockGrant and its FenceCounter.
	Namespace string
}

// Key names one protected resource among the records of the store's
// cluster: the namespace its resource ID is scoped to, and the ID.
type Key struct {
	// Namespace is the namespace of the resource's LockGrants, e.g.
	// "billing".
	Namespace string
	// Resource is the resource ID, e.g. "invoice-batch/2026-07-19".
	Resource string
}

// String returns "NAMESPACE/RESOURCE".
func (k Key) String() string { return k.Namespace + "/" + k.Resource }

// ref is a resource's full identity in the tables: scope and resource ID.
type ref struct {
	Scope
	resource string
}

// String returns `resource "R" in namespace "N" of cluster "C"`.
func (r ref) String() string {
	return fmt.Sprintf("resource %q in namespace %q of cluster %q", r.resource, r.Namespace, r.Cluster)
}

// args are the key columns' values, in the order (cluster, namespace,
// resource) of every statement.
func (r ref) args(more ...any) []any {
	return append([]any{r.Cluster, r.Namespace, r.resource}, more...)
}

// ref returns the full identity of k in this store's cluster, or a
// NO_RESOURCE refusal when any part of it is missing: a record without its
// scope would share its ledger with every namespace and cluster that uses
// the same resource ID.
func (s *Store) ref(k Key) (ref, *fencing.Error) {
	r := ref{Scope: Scope{Cluster: s.cluster, Namespace: k.Namespace}, resource: k.Resource}
	switch {
	case s.cluster == "":
		return r, noResource("the store names no issuing cluster: fences are issued per cluster; create the store with postgres.WithCluster")
	case k.Namespace == "":
		return r, noResource("resource %q names no namespace: resource IDs and their fences are per namespace", k.Resource)
	case k.Resource == "":
		return r, noResource("the segment names no resource")
	}
	return r, nil
}

func noResource(format string, args ...any) *fencing.Error {
	return &fencing.Error{Reason: fencing.ReasonNoResource, Detail: fmt.Sprintf(format, args...)}
}
