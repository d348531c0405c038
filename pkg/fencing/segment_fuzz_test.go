package fencing_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// segmentModel is a registry and one resource driven by a fuzzer: grants
// are issued, expire and are released; the registry can be snapshotted and
// restored (so fences are issued twice); writers send segments of a few
// operations under any grant they were ever issued, with one of two
// payloads. The resource applies CheckSegment's decisions the way a store
// does.
type segmentModel struct {
	t   *testing.T
	now time.Time

	// The registry.
	counter  fencing.Counter
	grants   map[string]*fencing.Grant
	snapshot *segmentModel // registry part only
	// issued is every grant ever handed to a writer, in issue order.
	issued []fencing.Grant

	// The resource.
	ledger   fencing.Ledger
	receipts map[string]fencing.Receipt
	effects  map[string]int
	// accepted is the fence of every applied or duplicate-accepted
	// segment, in order.
	accepted []int64
}

func key(root string, seq int64) string { return fmt.Sprintf("%s/%d", root, seq) }

func (m *segmentModel) acquire(owner string) {
	if h := m.grants[m.counter.HolderUID]; h != nil {
		h.State = fencing.StateReleased
	}
	m.counter.Fence++
	g := &fencing.Grant{UID: fmt.Sprintf("uid-%d", len(m.issued)), Resource: segRes, Owner: owner, State: fencing.StateHeld, Fence: m.counter.Fence, ExpiresAt: m.now.Add(10 * time.Second)}
	m.counter.HolderUID = g.UID
	m.grants[g.UID] = g
	m.issued = append(m.issued, *g)
}

func (m *segmentModel) save() {
	s := &segmentModel{counter: m.counter, grants: map[string]*fencing.Grant{}}
	for uid, g := range m.grants {
		c := *g
		s.grants[uid] = &c
	}
	m.snapshot = s
}

func (m *segmentModel) restore() {
	if m.snapshot == nil {
		return
	}
	m.counter, m.grants = m.snapshot.counter, m.snapshot.grants
	m.save() // keep a private copy for a later restore
}

func (m *segmentModel) write(caller string, g fencing.Grant, root string, seq int64, digest string) {
	t := m.t
	s := fencing.Segment{Fence: g.Fence, GrantUID: g.UID, Root: root, Seq: seq, Digest: digest}
	w := fencing.SegmentWrite{
		Resource: segRes, Caller: caller, Segment: s, Now: m.now,
		Grant: m.grants[g.UID], Counter: &m.counter, Ledger: m.ledger,
	}
	if r, ok := m.receipts[key(root, seq)]; ok {
		w.Prior = &r
	}
	for n := int64(1); ; n++ {
		if _, ok := m.receipts[key(root, n)]; !ok {
			w.RootLastSeq = n - 1
			break
		}
	}
	registryFence := m.counter.Fence
	d, err := fencing.CheckSegment(w)
	if err != nil {
		if fencing.ReasonOf(err) == "" {
			t.Fatalf("refusal without a reason: %v", err)
		}
		return
	}
	switch {
	case d.Next.Fence < m.ledger.Fence:
		t.Fatalf("segment %+v lowered the highest fence from %d to %d", s, m.ledger.Fence, d.Next.Fence)
	case s.Fence < m.ledger.Fence || s.Fence < registryFence:
		t.Fatalf("accepted stale fence %d (ledger %d, registry %d)", s.Fence, m.ledger.Fence, registryFence)
	case caller != g.Owner:
		t.Fatalf("accepted a segment of %q from %q", g.Owner, caller)
	case d.Next.Fence != s.Fence:
		t.Fatalf("accepted fence %d but the ledger records %d", s.Fence, d.Next.Fence)
	}
	if n := len(m.accepted); n > 0 && m.accepted[n-1] > s.Fence {
		t.Fatalf("accepted fence %d after fence %d", s.Fence, m.accepted[n-1])
	}
	m.accepted = append(m.accepted, s.Fence)
	switch d.Verdict {
	case fencing.VerdictApply:
		if m.effects[key(root, seq)] > 0 {
			t.Fatalf("segment %s applied twice", key(root, seq))
		}
		if seq > 1 && m.effects[key(root, seq-1)] == 0 {
			t.Fatalf("segment %s applied before segment %d", key(root, seq), seq-1)
		}
		m.effects[key(root, seq)]++
		m.receipts[key(root, seq)] = fencing.Receipt{ID: key(root, seq), Resource: segRes, Fence: s.Fence, GrantUID: s.GrantUID, Root: root, Seq: seq, Digest: digest, AcceptedAt: m.now}
	case fencing.VerdictDuplicate:
		if d.Receipt == nil || *d.Receipt != m.receipts[key(root, seq)] || d.Receipt.Digest != digest {
			t.Fatalf("duplicate %+v answered with receipt %+v", s, d.Receipt)
		}
	default:
		t.Fatalf("unknown verdict %v", d.Verdict)
	}
	m.ledger = d.Next
}

// Encoding of one step of a fuzzed sequence: an opcode byte, then its
// arguments, one byte each.
const (
	opAcquire  = iota // owner: the registry issues the next fence
	opRelease         // the holder releases
	opSnapshot        // the registry is snapshotted
	opRestore         // the registry is restored from the snapshot
	opTick            // seconds: the clock advances
	opWrite           // grant, caller (0: the grant's owner), root, seq-1, payload
	opCount
)

func acq(owner byte) []byte { return []byte{opAcquire, owner} }
func wr(grant, root, seq, payload byte) []byte {
	return []byte{opWrite, grant, 0, root, seq - 1, payload}
}
func steps(s ...[]byte) []byte {
	var b []byte
	for _, x := range s {
		b = append(b, x...)
	}
	return b
}

// FuzzSegmentSequences drives random sequences of grants, registry
// restores and segments, and checks that no sequence ever lowers the
// resource's highest fence, accepts a stale fence or another owner's
// segment, applies a segment twice or out of order, or answers a resend
// with anything but the original receipt.
func FuzzSegmentSequences(f *testing.F) {
	// A new owner retries an operation: W1 writes P/1 and freezes past its lease; W2 resends P/1 and
	// writes P/2; W1 wakes and writes P/2, P/3; W2 skips to P/4; W2 resends
	// P/2 with another payload.
	f.Add(steps(acq(0), wr(0, 0, 1, 0), []byte{opTick, 11}, acq(1), wr(1, 0, 1, 0), wr(1, 0, 2, 0),
		wr(0, 0, 2, 0), wr(0, 0, 3, 0), wr(1, 0, 4, 0), wr(1, 0, 2, 1)))
	// A restore from an old snapshot: fences 1, 2, snapshot, fence 3 written, restore, fence 3 again.
	f.Add(steps(acq(0), acq(1), []byte{opSnapshot}, acq(2), wr(2, 0, 1, 0), []byte{opRestore}, wr(1, 1, 1, 0),
		acq(0), wr(3, 1, 1, 0), acq(0), wr(4, 1, 1, 0)))
	// A release while an operation is still writing: A writes X/1, releases; B writes Y/1; A's X/2 arrives.
	f.Add(steps(acq(0), wr(0, 0, 1, 0), []byte{opRelease}, acq(1), wr(1, 1, 1, 0), wr(0, 0, 2, 0)))
	f.Fuzz(func(t *testing.T, ops []byte) {
		m := &segmentModel{t: t, now: t0, grants: map[string]*fencing.Grant{}, receipts: map[string]fencing.Receipt{}, effects: map[string]int{}}
		owners := []string{"A", "B", "C"}
		next := func() byte {
			if len(ops) == 0 {
				return 0
			}
			b := ops[0]
			ops = ops[1:]
			return b
		}
		for len(ops) > 0 {
			switch next() % opCount {
			case opAcquire:
				m.acquire(owners[int(next())%len(owners)])
			case opRelease:
				if h := m.grants[m.counter.HolderUID]; h != nil {
					h.State = fencing.StateReleased
					m.counter.HolderUID = ""
				}
			case opSnapshot:
				m.save()
			case opRestore:
				m.restore()
			case opTick:
				m.now = m.now.Add(time.Duration(next()%16) * time.Second)
			case opWrite:
				gi, ci, ri, si, pi := next(), next(), next(), next(), next()
				if len(m.issued) == 0 {
					continue
				}
				g := m.issued[int(gi)%len(m.issued)]
				caller := g.Owner
				if ci != 0 {
					caller = owners[int(ci)%len(owners)]
				}
				root := []string{"P", "Q", "R"}[int(ri)%3]
				m.write(caller, g, root, int64(si%4)+1, []string{dig1, dig2}[int(pi)%2])
			}
		}
		if testing.Verbose() {
			t.Logf("ledger %+v, %d accepted, effects %v", m.ledger, len(m.accepted), m.effects)
		}
	})
}
