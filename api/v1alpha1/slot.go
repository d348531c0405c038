package v1alpha1

import (
	"strconv"
	"strings"
)

// A resource with permits (LockGrantSpec.Permits) is a set of exclusive
// slots, each with its own FenceCounter and fence sequence, named by its
// fenced resource ID: slot 0 is the resource ID itself, so that an exclusive
// lock is slot 0 of a resource with one permit, and slot k>0 is the
// resource ID followed by SlotSeparator and k in decimal, for example
// "batch/nightly#2". A resource ID cannot contain SlotSeparator
// (ResourcePattern), so no slot's ID is ever another resource's ID.
const (
	// SlotSeparator separates a resource ID from its slot number.
	SlotSeparator = "#"
	// MaxFencedResourceLength is the longest fenced resource ID, in bytes:
	// the longest resource ID and "#63".
	MaxFencedResourceLength = MaxResourceLength + 3
)

// EffectivePermits returns the number of permits a grant asks for: spec
// permits, or 1 when unset.
func (s *LockGrantSpec) EffectivePermits() int32 {
	if s.Permits < 1 {
		return 1
	}
	return s.Permits
}

// SlotResource returns the fenced resource ID of slot k of resource: the
// resource ID itself for slot 0, resource + "#k" otherwise. It does not
// validate its arguments.
func SlotResource(resource string, k int32) string {
	if k == 0 {
		return resource
	}
	return resource + SlotSeparator + strconv.FormatInt(int64(k), 10)
}

// ParseSlotResource splits a fenced resource ID into its resource ID and
// slot: ("R", 0, true) for a valid resource ID R, ("R", k, true) for
// "R#k" with R valid and k from 1 to MaxPermits-1 written in decimal
// without leading zeros, and ok false for anything else, so that every slot
// has exactly one fenced resource ID.
func ParseSlotResource(id string) (resource string, k int32, ok bool) {
	base, num, found := strings.Cut(id, SlotSeparator)
	if !ValidResourceID(base) {
		return "", 0, false
	}
	if !found {
		return base, 0, true
	}
	if num == "" || len(num) > 2 || num[0] == '0' {
		return "", 0, false
	}
	n := int32(0)
	for _, c := range []byte(num) {
		if c < '0' || c > '9' {
			return "", 0, false
		}
		n = n*10 + int32(c-'0')
	}
	if n >= MaxPermits {
		return "", 0, false
	}
	return base, n, true
}

// ValidFencedResource reports whether id names a slot of a resource: a
// valid resource ID, optionally followed by "#k" with k from 1 to
// MaxPermits-1. Guarded objects name their fenced resource ID in
// ResourceAnnotation.
func ValidFencedResource(id string) bool {
	_, _, ok := ParseSlotResource(id)
	return ok
}

// HeldSlot returns the slot a Held (or ended) grant holds: status.permit,
// or 0 when unset (an exclusive lock, or slot 0 of a grant that asks for
// one permit).
func (g *LockGrant) HeldSlot() int32 {
	if g.Status.Permit == nil {
		return 0
	}
	return *g.Status.Permit
}

// HeldFencedResource returns the fenced resource ID of the slot a Held
// grant holds: status.fencedResource, or spec.resource when unset (slot 0).
// Guarded objects and store rows that accept the grant's fence are bound
// to this ID, and the grant's signed record names it.
func (g *LockGrant) HeldFencedResource() string {
	if g.Status.FencedResource != "" {
		return g.Status.FencedResource
	}
	return g.Spec.Resource
}
