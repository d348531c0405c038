package grantplan

import (
	"slices"
	"time"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// HolderReadNeeded reports whether a pass must read the grant of counter
// holder h directly, beside the (possibly lagging) grants it listed: the
// list lacks it (created a moment ago, or deleted), its lease as the
// counter records it is over at now (a renew applied a moment ago must not
// be missed), or the counter does not record its lease (written before
// counters carried it). A listed copy that already asks for release needs
// no read: release can never be unset, so the grant ends whatever else the
// list lags on.
func HolderReadNeeded(grants []lockingv1alpha1.LockGrant, h *lockingv1alpha1.FenceHolder, now time.Time) bool {
	i := holderIndex(grants, h)
	if i >= 0 && grants[i].Spec.Release {
		return false
	}
	end, recorded, err := h.LeaseEnd()
	return i < 0 || !recorded || err != nil || fencing.Expired(end, now)
}

// WithHolder returns grants with holder h's listed copy replaced by fresh,
// as read directly; fresh nil (the grant is gone, or another grant took its
// name) removes it.
func WithHolder(grants []lockingv1alpha1.LockGrant, h *lockingv1alpha1.FenceHolder, fresh *lockingv1alpha1.LockGrant) []lockingv1alpha1.LockGrant {
	if fresh != nil && string(fresh.UID) != h.UID {
		fresh = nil
	}
	i := holderIndex(grants, h)
	switch {
	case fresh == nil && i >= 0:
		return slices.Delete(grants, i, i+1)
	case fresh != nil && i >= 0:
		grants[i] = *fresh.DeepCopy()
	case fresh != nil:
		return append(grants, *fresh.DeepCopy())
	}
	return grants
}

func holderIndex(grants []lockingv1alpha1.LockGrant, h *lockingv1alpha1.FenceHolder) int {
	return slices.IndexFunc(grants, func(g lockingv1alpha1.LockGrant) bool { return string(g.UID) == h.UID })
}
