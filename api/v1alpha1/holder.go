package v1alpha1

import (
	"fmt"
	"time"
)

// FormatInstant writes an instant as the counter keeps it (expiresAt,
// lockDelayUntil): RFC 3339 in UTC with nanoseconds.
func FormatInstant(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// LeaseEnd is the end of the holder's lease as the counter records it
// (spec.holder.expiresAt). ok is false when the counter does not record it
// (written before it carried the lease); err is set when the value cannot be
// read, which every reader treats as a lease that is over (fail closed).
func (h *FenceHolder) LeaseEnd() (t time.Time, ok bool, err error) {
	if h == nil || h.ExpiresAt == "" {
		return time.Time{}, false, nil
	}
	t, err = time.Parse(time.RFC3339Nano, h.ExpiresAt)
	if err != nil {
		return time.Time{}, true, fmt.Errorf("the fence record's holder.expiresAt %q is not an RFC 3339 time: %w", h.ExpiresAt, err)
	}
	return t, true, nil
}
