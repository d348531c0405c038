package sim

import (
	"time"
)

// event is one scheduled action at virtual time at; seq breaks ties in
// scheduling order, so a round is deterministic.
type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

// before orders events by time, then by scheduling order: a total order
// (seq is unique), so events run in the same order whatever the heap.
func (e event) before(o event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	return e.seq < o.seq
}

// queue is a binary min-heap of events (container/heap's layout, without
// boxing each event in an interface).
type queue []event

func (q *queue) push(e event) {
	*q = append(*q, e)
	h := *q
	for i := len(h) - 1; i > 0; {
		parent := (i - 1) / 2
		if !h[i].before(h[parent]) {
			break
		}
		h[i], h[parent] = h[parent], h[i]
		i = parent
	}
}

func (q *queue) pop() event {
	h := *q
	top := h[0]
	n := len(h) - 1
	h[0] = h[n]
	h[n] = event{}
	h = h[:n]
	for i := 0; ; {
		least, l, r := i, 2*i+1, 2*i+2
		if l < n && h[l].before(h[least]) {
			least = l
		}
		if r < n && h[r].before(h[least]) {
			least = r
		}
		if least == i {
			break
		}
		h[i], h[least] = h[least], h[i]
		i = least
	}
	*q = h
	return top
}

// scheduler runs events in virtual time order.
type scheduler struct {
	now time.Duration
	seq uint64
	q   queue
}

// at schedules fn at virtual time t (never before now).
func (s *scheduler) at(t time.Duration, fn func()) {
	if t < s.now {
		t = s.now
	}
	s.seq++
	s.q.push(event{at: t, seq: s.seq, fn: fn})
}

// after schedules fn d after now.
func (s *scheduler) after(d time.Duration, fn func()) { s.at(s.now+d, fn) }

// run executes events until none is left or the horizon passes.
func (s *scheduler) run(horizon time.Duration) {
	for len(s.q) > 0 {
		e := s.q.pop()
		if e.at > horizon {
			return
		}
		s.now = e.at
		e.fn()
	}
}
