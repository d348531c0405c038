package main

import (
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// linearizeTimeout bounds each porcupine check; a check that runs out is
// reported as a violation (inconclusive), never as a pass.
const linearizeTimeout = 2 * time.Minute

// pendingReturn is the return time of an operation whose completion was
// never observed: it may take effect at any time after its call.
const pendingReturn = int64(math.MaxInt64)

// The fenced lock model: one resource's lock, whose state is the grant
// holding it and the highest fence issued.
//
//	acquire(g, f)  free and f above every earlier fence -> held by g
//	end(g)         held by g -> free (a release, an expiry, a revocation)
//	write(g)       held by g (an accepted guarded write is made under the
//	               grant holding the lock at some instant of the write)
//
// Intervals: an acquire runs from the worker's create to the worker seeing
// the grant Held (pending if it never did); an end from the worker's
// release (or, for an expiry, the final expiresAt, from which admission
// refuses the grant) to the observer seeing it ended; a write from its
// invocation to its acknowledgement, or to the observer seeing the version
// when the worker never learnt the outcome.
type lockInput struct {
	kind  string
	grant string
	fence int64
}

type lockState struct {
	holder string
	fence  int64
}

var lockModel = porcupine.Model{
	Init: func() any { return lockState{} },
	Step: func(state, input, _ any) (bool, any) {
		s, in := state.(lockState), input.(lockInput)
		switch in.kind {
		case "acquire":
			if s.holder == "" && in.fence > s.fence {
				return true, lockState{holder: in.grant, fence: in.fence}
			}
		case "end":
			if s.holder == in.grant {
				return true, lockState{fence: s.fence}
			}
		case "write":
			return s.holder == in.grant, s
		}
		return false, s
	},
	DescribeOperation: func(input, _ any) string {
		in := input.(lockInput)
		if in.kind == "acquire" {
			return fmt.Sprintf("acquire(%s, fence %d)", in.grant, in.fence)
		}
		return fmt.Sprintf("%s(%s)", in.kind, in.grant)
	},
	DescribeState: func(state any) string {
		s := state.(lockState)
		if s.holder == "" {
			return fmt.Sprintf("free (fence %d)", s.fence)
		}
		return fmt.Sprintf("held by %s (fence %d)", s.holder, s.fence)
	},
}

// lockHistory builds the lock model's operations for resource.
func (w *world) lockHistory(resource string) []porcupine.Operation {
	var ops []porcupine.Operation
	add := func(client int, in lockInput, call, ret int64) {
		ops = append(ops, porcupine.Operation{ClientId: client, Input: in, Call: min(call, ret), Output: nil, Return: ret})
	}
	clients := map[string]int{}
	clientOf := func(proc string) int {
		if _, ok := clients[proc]; !ok {
			clients[proc] = len(clients)
		}
		return clients[proc]
	}
	for _, g := range w.heldGrants(resource) {
		call, ret := g.grantedAt.UnixNano(), pendingReturn
		if g.created != nil {
			call = g.created.UnixNano() // whole seconds, rounded down
		}
		if a := w.firstOp(OpAcquire, g.name); a != nil {
			call = a.invoke.Time.UnixNano()
			if a.outcome() == EventOK {
				ret = a.done.Time.UnixNano()
			}
		}
		add(clientOf(g.owner), lockInput{kind: "acquire", grant: g.name, fence: g.fence}, call, ret)
		if !g.ended() {
			continue
		}
		start := *g.grantedAt
		switch {
		case g.phase == "Expired" && g.expiresAt != nil:
			start = *g.expiresAt
		case g.phase == "Released":
			if r := w.firstOp(OpRelease, g.name); r != nil {
				start = r.invoke.Time
			}
		}
		end := g.seenEnded
		if end.IsZero() {
			end = w.end
		}
		add(clientOf("registry:"+g.name), lockInput{kind: "end", grant: g.name}, start.UnixNano(), end.UnixNano())
	}
	for _, obj := range sortedKeys(w.versions) {
		for _, v := range w.versions[obj] {
			o := w.writeOf(v)
			if v.Resource != resource || o == nil {
				continue
			}
			ret := v.Time.UnixNano()
			if o.outcome() == EventOK {
				ret = o.done.Time.UnixNano()
			}
			add(clientOf(o.invoke.Proc), lockInput{kind: "write", grant: v.Grant}, o.invoke.Time.UnixNano(), ret)
		}
	}
	return ops
}

// The compare-and-swap register model of a guarded object: its state is
// its resourceVersion ("" before it exists) and count. A read returns both;
// a write with precondition expectRV succeeds only if it matches, and a
// conflict only if it does not; an unconditional write always succeeds.
// The object as listed after the run is a last read. Refused writes and writes of unknown
// outcome that never showed up have no effect and are left out; those that
// showed up are acknowledged at the moment the observer saw them.
type regInput struct {
	write bool
	// unconditional: no precondition (an update sent without
	// resourceVersion); else the write requires expectRV ("" for a create).
	unconditional bool
	expectRV      string
	count         int64
}

type regOutput struct {
	conflict bool
	rv       string
	count    int64
}

type regState struct {
	rv    string
	count int64
}

var registerModel = porcupine.Model{
	Init: func() any { return regState{} },
	Step: func(state, input, output any) (bool, any) {
		s, in, out := state.(regState), input.(regInput), output.(regOutput)
		switch {
		case !in.write:
			return s.rv == out.rv && s.count == out.count, s
		case out.conflict:
			return !in.unconditional && s.rv != in.expectRV, s
		case in.unconditional || s.rv == in.expectRV:
			return true, regState{rv: out.rv, count: in.count}
		}
		return false, s
	},
	DescribeOperation: func(input, output any) string {
		in, out := input.(regInput), output.(regOutput)
		switch {
		case !in.write:
			return fmt.Sprintf("read() -> %d @%s", out.count, out.rv)
		case out.conflict:
			return fmt.Sprintf("write(%d if @%s) -> conflict", in.count, in.expectRV)
		case in.unconditional:
			return fmt.Sprintf("write(%d) -> @%s", in.count, out.rv)
		}
		return fmt.Sprintf("write(%d if @%s) -> @%s", in.count, in.expectRV, out.rv)
	},
	DescribeState: func(state any) string {
		s := state.(regState)
		return fmt.Sprintf("%d @%s", s.count, s.rv)
	},
}

// registerHistory builds the register model's operations for object.
func (w *world) registerHistory(object string) []porcupine.Operation {
	appliedAt := map[string]Event{}
	for _, v := range w.versions[object] {
		appliedAt[v.WriteID] = v
	}
	var ops []porcupine.Operation
	clients := map[string]int{}
	clientOf := func(proc string) int {
		if _, ok := clients[proc]; !ok {
			clients[proc] = len(clients)
		}
		return clients[proc]
	}
	for _, o := range w.opsOf[OpRead] {
		if o.invoke.Object != object || o.outcome() != EventOK {
			continue
		}
		ops = append(ops, porcupine.Operation{
			ClientId: clientOf(o.invoke.Proc), Input: regInput{},
			Call: o.invoke.Time.UnixNano(), Return: o.done.Time.UnixNano(),
			Output: regOutput{rv: o.done.RV, count: o.done.Count},
		})
	}
	if f, ok := w.final[object]; ok {
		// The object after the run is a last read, after everything.
		ops = append(ops, porcupine.Operation{
			ClientId: clientOf(f.Proc), Input: regInput{},
			Call: f.Time.UnixNano(), Return: f.Time.UnixNano(),
			Output: regOutput{rv: f.RV, count: f.Count},
		})
	}
	for _, o := range w.opsOf[OpWrite] {
		if o.invoke.Object != object {
			continue
		}
		in := regInput{write: true, unconditional: o.invoke.Unconditional, expectRV: o.invoke.ExpectRV, count: o.invoke.Count}
		call := o.invoke.Time.UnixNano()
		switch v, applied := appliedAt[o.invoke.ID]; {
		case o.outcome() == EventOK:
			ops = append(ops, porcupine.Operation{ClientId: clientOf(o.invoke.Proc), Input: in, Call: call,
				Return: o.done.Time.UnixNano(), Output: regOutput{rv: o.done.RV}})
		case o.outcome() == EventFail && o.done.Reason == reasonConflict:
			ops = append(ops, porcupine.Operation{ClientId: clientOf(o.invoke.Proc), Input: in, Call: call,
				Return: o.done.Time.UnixNano(), Output: regOutput{conflict: true}})
		case o.outcome() == EventInfo && applied:
			ops = append(ops, porcupine.Operation{ClientId: clientOf(o.invoke.Proc), Input: in, Call: call,
				Return: max(call, v.Time.UnixNano()), Output: regOutput{rv: v.RV}})
		}
	}
	return ops
}

// illegal is a partition porcupine found not linearizable, kept for its
// visualization.
type illegal struct {
	name  string
	model porcupine.Model
	info  porcupine.LinearizationInfo
}

// linearizable checks every resource against the lock model and every
// object against the register model; it returns the violations and the
// number of operations checked per model.
func (w *world) linearizable() (vs []Violation, lockOps, regOps int, bad []illegal) {
	check := func(name, what string, model porcupine.Model, ops []porcupine.Operation) {
		res, info := porcupine.CheckOperationsVerbose(model, ops, linearizeTimeout)
		switch res {
		case porcupine.Illegal:
			vs = append(vs, violation(what, "%s: the history of %d operations is not linearizable (see porcupine-%s.html)", name, len(ops), safeName(name)))
			bad = append(bad, illegal{name: name, model: model, info: info})
		case porcupine.Unknown:
			vs = append(vs, violation(what, "%s: porcupine could not decide within %s (%d operations)", name, linearizeTimeout, len(ops)))
		}
	}
	for _, res := range w.resources() {
		ops := w.lockHistory(res)
		lockOps += len(ops)
		check(res, checkLockModel, lockModel, ops)
	}
	for _, obj := range sortedKeys(w.versions) {
		ops := w.registerHistory(obj)
		regOps += len(ops)
		check(obj, checkRegister, registerModel, ops)
	}
	return vs, lockOps, regOps, bad
}

// WriteVisualizations writes porcupine's HTML view of every partition that
// is not linearizable into dir.
func (r *Report) WriteVisualizations(dir string) error {
	for _, b := range r.illegal {
		f, err := os.Create(filepath.Join(dir, "porcupine-"+safeName(b.name)+".html"))
		if err != nil {
			return err
		}
		err = porcupine.Visualize(b.model, b.info, f)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func safeName(s string) string { return strings.ReplaceAll(s, "/", "_") }
