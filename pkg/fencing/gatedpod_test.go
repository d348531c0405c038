package fencing_test

import (
	"errors"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

const (
	worker  = "system:serviceaccount:billing:worker"
	manager = "system:serviceaccount:lockwarden-system:lockwarden-controller-manager"
)

func TestCheckGatedPod(t *testing.T) {
	failed := errors.New("authorization unavailable")
	cases := []struct {
		name   string
		pod    fencing.GatedPod
		answer asked
		want   fencing.Reason
		err    error
		asks   int
		detail string
	}{
		{"its ServiceAccount may acquire", fencing.GatedPod{Namespace: "billing", Owner: worker}, asked{allowed: true}, "", nil, 1, ""},
		{"its ServiceAccount may not acquire", fencing.GatedPod{Namespace: "billing", Owner: worker}, asked{}, fencing.ReasonNotOwner, nil, 1,
			`"system:serviceaccount:billing:worker" may not create lockgrants in namespace "billing", so a Pod running as it may not acquire there either`},
		{"bound to a node at creation", fencing.GatedPod{Namespace: "billing", Owner: worker, NodeName: "n1"}, asked{allowed: true}, fencing.ReasonInvalidSpec, nil, 0, ""},
		{"authorization fails", fencing.GatedPod{Namespace: "billing", Owner: worker}, asked{err: failed}, "", failed, 1, ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			c.pod.MayAcquire = c.answer.answer
			err := fencing.CheckGatedPod(c.pod)
			if c.err != nil {
				if !errors.Is(err, c.err) || fencing.ReasonOf(err) != "" {
					t.Fatalf("got %v, want the authorization error as is", err)
				}
			} else {
				checkRefusal(t, err, c.want, c.detail)
			}
			if c.answer.n != c.asks {
				t.Fatalf("authorization asked %d times, want %d", c.answer.n, c.asks)
			}
		})
	}
}

func TestCheckGrantCreate(t *testing.T) {
	pod := fencing.BoundPod{UID: "u1", Owner: worker, Lock: "invoice-batch/2026-07-19", RequestID: "pod-u1",
		RequestedAt: "2026-07-19T00:00:00.5Z", Gated: true}
	good := fencing.GrantCreate{Requester: manager, Owner: worker, Manager: manager, Namespace: "billing",
		Resource: "invoice-batch/2026-07-19", RequestID: "pod-u1", RequestedAt: "2026-07-19T00:00:00.5Z",
		Pod: &fencing.PodRef{Name: "settle-0", UID: "u1"}}
	with := func(f func(*fencing.GrantCreate, *fencing.BoundPod)) (fencing.GrantCreate, fencing.BoundPod) {
		c, p := good, pod
		f(&c, &p)
		return c, p
	}
	type tc struct {
		name        string
		c           fencing.GrantCreate
		p           fencing.BoundPod
		podGone     bool
		mayAcquire  bool
		want        fencing.Reason
		reads, asks int
		detail      string
	}
	cases := []tc{
		{name: "the manager, for a gated Pod of the owner", c: good, p: pod, mayAcquire: true, reads: 1, asks: 1},
		{name: "anyone, for itself", c: fencing.GrantCreate{Requester: worker, Owner: worker}},
		{name: "the manager, for itself", c: fencing.GrantCreate{Requester: manager, Owner: manager, Manager: manager}},
		func() tc {
			c, p := with(func(c *fencing.GrantCreate, _ *fencing.BoundPod) { c.Requester = "alice" })
			return tc{name: "a user, for a ServiceAccount that has a gated Pod", c: c, p: p, mayAcquire: true, want: fencing.ReasonNotOwner,
				detail: `spec.owner "system:serviceaccount:billing:worker" must be the requesting user "alice" (leave it empty to default it)`}
		}(),
		func() tc {
			c, p := with(func(c *fencing.GrantCreate, _ *fencing.BoundPod) { c.Manager = "" })
			return tc{name: "the manager's identity unknown", c: c, p: p, mayAcquire: true, want: fencing.ReasonNotOwner}
		}(),
		func() tc {
			c, p := with(func(c *fencing.GrantCreate, _ *fencing.BoundPod) { c.Pod = nil })
			return tc{name: "the manager, for an owner without a Pod", c: c, p: p, mayAcquire: true, want: fencing.ReasonNotOwner,
				detail: `the manager requests a grant for "system:serviceaccount:billing:worker" only on behalf of a Pod: the grant must name it as its controller, with its UID`}
		}(),
		{name: "the Pod is gone", c: good, p: pod, podGone: true, mayAcquire: true, want: fencing.ReasonNotOwner, reads: 1,
			detail: "Pod billing/settle-0 with uid u1 does not exist: the grant is requested on its behalf"},
		func() tc {
			c, p := with(func(_ *fencing.GrantCreate, p *fencing.BoundPod) { p.UID = "u2" })
			return tc{name: "another Pod of that name", c: c, p: p, mayAcquire: true, want: fencing.ReasonNotOwner, reads: 1}
		}(),
		func() tc {
			c, p := with(func(_ *fencing.GrantCreate, p *fencing.BoundPod) { p.Owner = "system:serviceaccount:billing:other" })
			return tc{name: "the Pod runs as another ServiceAccount", c: c, p: p, mayAcquire: true, want: fencing.ReasonNotOwner, reads: 1,
				detail: `Pod billing/settle-0 runs as "system:serviceaccount:billing:other": a grant requested on its behalf is owned by that identity, not "system:serviceaccount:billing:worker"`}
		}(),
		func() tc {
			c, p := with(func(_ *fencing.GrantCreate, p *fencing.BoundPod) { p.Lock = "other" })
			return tc{name: "the Pod names another lock", c: c, p: p, mayAcquire: true, want: fencing.ReasonBindingMismatch, reads: 1}
		}(),
		func() tc {
			c, p := with(func(c *fencing.GrantCreate, _ *fencing.BoundPod) { c.RequestID = "pod-u9" })
			return tc{name: "another request ID", c: c, p: p, mayAcquire: true, want: fencing.ReasonBindingMismatch, reads: 1}
		}(),
		func() tc {
			c, p := with(func(c *fencing.GrantCreate, _ *fencing.BoundPod) { c.RequestedAt = "2026-07-18T00:00:00Z" })
			return tc{name: "an earlier place in the queue", c: c, p: p, mayAcquire: true, want: fencing.ReasonBindingMismatch, reads: 1}
		}(),
		func() tc {
			c, p := with(func(_ *fencing.GrantCreate, p *fencing.BoundPod) { p.Gated = false })
			return tc{name: "the Pod is no longer gated", c: c, p: p, mayAcquire: true, want: fencing.ReasonAlreadyEnded, reads: 1}
		}(),
		func() tc {
			c, p := with(func(_ *fencing.GrantCreate, p *fencing.BoundPod) { p.Deleting = true })
			return tc{name: "the Pod is being deleted", c: c, p: p, mayAcquire: true, want: fencing.ReasonAlreadyEnded, reads: 1}
		}(),
		{name: "the owner may not acquire", c: good, p: pod, want: fencing.ReasonNotOwner, reads: 1, asks: 1},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			reads := 0
			answer := asked{allowed: c.mayAcquire}
			c.c.ReadPod = func() (*fencing.BoundPod, error) {
				reads++
				if c.podGone {
					return nil, nil
				}
				p := c.p
				return &p, nil
			}
			c.c.MayAcquire = answer.answer
			checkRefusal(t, fencing.CheckGrantCreate(c.c), c.want, c.detail)
			if reads != c.reads || answer.n != c.asks {
				t.Fatalf("read the Pod %d times and asked %d, want %d and %d", reads, answer.n, c.reads, c.asks)
			}
		})
	}
}
