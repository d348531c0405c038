package fencing

// Who may acquire as whom through a lock-gated Pod (docs/gated-workloads.md).
//
// A Pod that names a lock acquires as its own ServiceAccount, never as
// anyone else: whoever may create a Pod that runs as ServiceAccount X in a
// namespace can already run code as X there, so letting that Pod hold a
// grant owned by X gives its creator no power it lacked. Two conditions
// keep it from giving more:
//
//   - X itself must be allowed to create LockGrants in the namespace
//     (asked of the API server's authorizer, a SubjectAccessReview): a Pod
//     never acquires a lock its ServiceAccount could not acquire directly.
//   - The manager, the one identity that creates grants for someone else,
//     does so only for a grant bound to such a Pod: an existing Pod, by
//     name and UID, in the grant's namespace, running as the owner,
//     naming the grant's resource, still held back by its scheduling gate.
//     The manager is not given a general power to act as others: a grant
//     it requests for an owner without such a Pod is refused, and every
//     other identity may create grants only for itself (CheckGrantOwner).

// GatedPod is what admission knows about a Pod that names a lock when it
// is created, for CheckGatedPod.
type GatedPod struct {
	// Namespace is the Pod's namespace; Owner the identity it acquires as,
	// its ServiceAccount's user name (system:serviceaccount:NS:NAME).
	Namespace, Owner string
	// NodeName is the Pod's spec.nodeName at creation: a Pod bound to a
	// node when it is created bypasses the scheduler and its gates.
	NodeName string
	// MayAcquire reports whether Owner may create LockGrants in Namespace
	// (a SubjectAccessReview); its error is returned as is. Asked last,
	// only when the other rules pass.
	MayAcquire func() (bool, error)
}

// CheckGatedPod reports whether a Pod that names a lock may be created and
// held back until its grant is Held: it must not be bound to a node
// already (ReasonInvalidSpec: a scheduling gate could not hold it), and
// its ServiceAccount must be allowed to acquire in its namespace
// (ReasonNotOwner).
func CheckGatedPod(p GatedPod) error {
	if p.NodeName != "" {
		return refuse(ReasonInvalidSpec, "a Pod that names a lock cannot set spec.nodeName (%q): a Pod bound at creation skips the scheduling gate that holds it back until its grant is Held", p.NodeName)
	}
	return checkMayAcquire(p.Owner, p.Namespace, p.MayAcquire)
}

// checkMayAcquire refuses (ReasonNotOwner) an owner that may not create
// LockGrants in ns.
func checkMayAcquire(owner, ns string, mayAcquire func() (bool, error)) error {
	allowed, err := mayAcquire()
	if err != nil {
		return err
	}
	if !allowed {
		return refuse(ReasonNotOwner, "%q may not create lockgrants in namespace %q, so a Pod running as it may not acquire there either", owner, ns)
	}
	return nil
}

// PodRef is a grant's controller reference to the Pod it is requested for.
type PodRef struct {
	Name, UID string
}

// BoundPod is a gated Pod as read when a grant for it is created.
type BoundPod struct {
	// UID is the Pod's UID.
	UID string
	// Owner is its ServiceAccount's user name.
	Owner string
	// Lock is the resource ID the Pod names (its lock annotation).
	Lock string
	// RequestID is the request ID of the Pod's grant (one per Pod UID).
	RequestID string
	// RequestedAt is the Pod's admission stamp, as written.
	RequestedAt string
	// Gated reports whether the Pod still carries its scheduling gate.
	Gated bool
	// Deleting reports whether the Pod is being deleted.
	Deleting bool
}

// GrantCreate is what the creation of a LockGrant involves, for
// CheckGrantCreate.
type GrantCreate struct {
	// Requester is the identity creating the grant; Owner the grant's
	// spec.owner (defaulted to the requester when empty).
	Requester, Owner string
	// Manager is the identity the manager runs as: the only one that
	// requests grants for others.
	Manager string
	// Namespace, Resource, RequestID and RequestedAt are the grant's.
	Namespace, Resource, RequestID, RequestedAt string
	// Pod is the grant's controller reference to a Pod; nil when it has
	// none.
	Pod *PodRef
	// ReadPod reads that Pod in Namespace directly from the API server:
	// nil when it does not exist. Asked only for a grant the manager
	// requests for someone else.
	ReadPod func() (*BoundPod, error)
	// MayAcquire reports whether Owner may create LockGrants in Namespace;
	// asked last, like ReadPod.
	MayAcquire func() (bool, error)
}

// CheckGrantCreate reports whether c.Requester may create a grant owned by
// c.Owner. Anyone may create grants for itself. A grant for another
// identity may only be requested by the manager, for a gated Pod, and is
// refused with ReasonNotOwner unless it names that Pod by name and UID,
// the Pod exists in the grant's namespace, runs as the owner, and the
// owner may acquire there; with ReasonBindingMismatch when it asks for
// another resource, request ID or place in the queue than the Pod's; with
// ReasonAlreadyEnded when the Pod has started or is being deleted.
func CheckGrantCreate(c GrantCreate) error {
	if c.Owner == c.Requester {
		return nil
	}
	if c.Manager == "" || c.Requester != c.Manager {
		return CheckGrantOwner(c.Owner, c.Requester)
	}
	if c.Pod == nil || c.Pod.Name == "" || c.Pod.UID == "" {
		return refuse(ReasonNotOwner, "the manager requests a grant for %q only on behalf of a Pod: the grant must name it as its controller, with its UID", c.Owner)
	}
	p, err := c.ReadPod()
	if err != nil {
		return err
	}
	switch {
	case p == nil || p.UID != c.Pod.UID:
		return refuse(ReasonNotOwner, "Pod %s/%s with uid %s does not exist: the grant is requested on its behalf", c.Namespace, c.Pod.Name, c.Pod.UID)
	case p.Owner != c.Owner:
		return refuse(ReasonNotOwner, "Pod %s/%s runs as %q: a grant requested on its behalf is owned by that identity, not %q", c.Namespace, c.Pod.Name, p.Owner, c.Owner)
	case p.Lock != c.Resource:
		return refuse(ReasonBindingMismatch, "Pod %s/%s names the lock %q, not %q", c.Namespace, c.Pod.Name, p.Lock, c.Resource)
	case p.RequestID != c.RequestID:
		return refuse(ReasonBindingMismatch, "the grant of Pod %s/%s has request ID %q, not %q", c.Namespace, c.Pod.Name, p.RequestID, c.RequestID)
	case p.RequestedAt != c.RequestedAt:
		return refuse(ReasonBindingMismatch, "Pod %s/%s was admitted at %q: its grant takes its place in the queue from then, not %q", c.Namespace, c.Pod.Name, p.RequestedAt, c.RequestedAt)
	case p.Deleting:
		return refuse(ReasonAlreadyEnded, "Pod %s/%s is being deleted", c.Namespace, c.Pod.Name)
	case !p.Gated:
		return refuse(ReasonAlreadyEnded, "Pod %s/%s is no longer held back by its scheduling gate: a grant is requested only for a Pod that waits for it", c.Namespace, c.Pod.Name)
	}
	return checkMayAcquire(c.Owner, c.Namespace, c.MayAcquire)
}
