package lock

// Settled reports whether the handle's loop has nothing due at this instant
// of its clock and no renew in flight: what a test waits for before it steps
// a fake clock again.
func (h *Handle) Settled() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.mono()
	if _, _, pending := h.m.PendingRenew(); pending {
		return false
	}
	at, ok := h.m.NextRenew(now)
	return !ok || at > now
}

// checkErr is Check's verdict alone.
func checkErr(h *Handle) error {
	_, err := h.Check()
	return err
}
