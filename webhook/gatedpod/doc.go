// Package gatedpod is the admission webhook of lock-gated Pods
// (docs/gated-workloads.md): every Pod created with the annotation
// locking.lockwarden.io/lock, and no other (the webhook configuration's
// matchConditions select them, so no other Pod ever waits for the
// manager), is checked and held back: its lock annotations must parse
// (INVALID_SPEC), it must not be bound to a node at creation
// (INVALID_SPEC), and its ServiceAccount must be allowed to create
// LockGrants in its namespace (NOT_OWNER), by pkg/fencing.CheckGatedPod.
// An accepted Pod gets the scheduling gate locking.lockwarden.io/lock, the
// label locking.lockwarden.io/gated=true the manager's Pod cache selects
// on, and its admission time (locking.lockwarden.io/requested-at), which
// places its grant in the queue. Annotations only the manager writes (the
// grant, fence and proof of a started Pod) are removed.
//
// It has no side effects: it asks the authorizer (a SubjectAccessReview,
// which stores nothing) and changes only the Pod it admits.
package gatedpod
