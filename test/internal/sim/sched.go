package sim

import (
	"container/heap"
	"time"
)

// event is one scheduled action at virtual time at; seq breaks ties in
// scheduling order, so a round is deterministic.
type event struct {
	at  time.Duration
	seq uint64
	fn  func()
}

type queue []event

func (q queue) Len() int { return len(q) }
func (q queue) Less(i, j int) bool {
	if q[i].at != q[j].at {
		return q[i].at < q[j].at
	}
	return q[i].seq < q[j].seq
}
func (q queue) Swap(i, j int) { q[i], q[j] = q[j], q[i] }

// Push adds x, an event, for container/heap.
func (q *queue) Push(x any) { *q = append(*q, x.(event)) }

// Pop removes and returns the last event, for container/heap.
func (q *queue) Pop() any {
	old := *q
	e := old[len(old)-1]
	*q = old[:len(old)-1]
	return e
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
	heap.Push(&s.q, event{at: t, seq: s.seq, fn: fn})
}

// after schedules fn d after now.
func (s *scheduler) after(d time.Duration, fn func()) { s.at(s.now+d, fn) }

// run executes events until none is left or the horizon passes.
func (s *scheduler) run(horizon time.Duration) {
	for s.q.Len() > 0 {
		e := heap.Pop(&s.q).(event)
		if e.at > horizon {
			return
		}
		s.now = e.at
		e.fn()
	}
}
