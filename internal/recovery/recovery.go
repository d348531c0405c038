// Package recovery finds the fences guarded objects have recorded, so that
// the registry never issues a fence at or below one of them
// (fencing.NextFenceAbove) when its FenceCounters are behind: after the
// CRDs were reinstalled (which deletes every counter) or etcd was restored
// from an old snapshot.
//
// A Scanner lists the metadata of every object of every kind it may list,
// in every namespace, and reads the annotation
// locking.lockwarden.io/accepted-fence that admission writes on each write
// it accepts. A floor holds back everyone's requests for its resource, so
// a record counts only where nobody but lockwarden can have written it
// (fencing.CountFloor): on an object guarded now, by the label or by a
// GuardPolicy in Enforce mode, and on any other object (no longer guarded,
// under a Shadow policy, never guarded) only when its accepted proof
// verifies against the issuer's trust bundle for the fence it records. A
// record on an object anyone may annotate (a ConfigMap of a user's own)
// would otherwise let that user wedge any resource of any namespace. A
// record an administrator overrode (accepted-intent "override", a wedged
// object being retired) is not counted. Each record is attributed to the
// fenced resource it fences: the resource its verified proof names; on a
// guarded object, the resource its accepted proof names, else the object's
// locking.lockwarden.io/resource annotation, else the resource ID a
// GuardPolicy that covers the object maps it to. A record none of these
// attributes counts in the global highest fence (logged) but holds no
// resource back: fences are compared within one resource only.
//
// The manager runs a scan at start, off the grant path (a normal start
// grants at once; until the first scan ends, only admission's own check
// protects the objects, as before), and again on an interval. A scan only
// raises floors. Before a floor holds a request back (its counter is
// behind it), the grant controller confirms it (Scanner.Confirm): the
// object is read again, and a floor whose object is gone or replaced is
// dropped, one whose object now records another fence (restored with etcd)
// takes that fence. A floor at or below its counter costs nothing.
package recovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	lockingv1alpha1 "github.com/lockwarden/lockwarden/api/v1alpha1"
	"github.com/lockwarden/lockwarden/internal/grantplan"
	"github.com/lockwarden/lockwarden/internal/policy"
	"github.com/lockwarden/lockwarden/pkg/fencing"
)

// The manager's RBAC rule for the scan (list on every kind) is in
// controllers (controller-gen reads its markers there).

// pageSize is how many objects one list request returns.
const pageSize = 500

// Floors is what one or more scans found.
type Floors struct {
	// byResource: by namespace and resource ID (slot 0's), the highest
	// record of each fenced resource (the resource and its slots).
	byResource map[string]map[string]grantplan.Floor
	// sources: the object each floor of byResource was read from, by
	// key(ns, resource) + "#" + fenced resource.
	sources map[string]source
	// Highest is the highest fence recorded anywhere, attributed or not.
	Highest grantplan.Floor
	// Records is how many records were counted; Unattributed how many of
	// them name no resource.
	Records, Unattributed int
	// Unreadable are the kinds the last scan could not list, with why.
	Unreadable []string
}

func key(ns, resource string) string { return ns + "/" + resource }

// source is where a floor was read: an object of gvr, with its UID.
type source struct {
	gvr      schema.GroupVersionResource
	ns, name string
	uid      string
}

func newFloors() *Floors {
	return &Floors{byResource: map[string]map[string]grantplan.Floor{}, sources: map[string]source{}}
}

// For returns the floors of resource in namespace ns and of its slots, by
// fenced resource ID; nil when none is known.
func (f *Floors) For(ns, resource string) map[string]grantplan.Floor {
	if f == nil {
		return nil
	}
	return f.byResource[key(ns, resource)]
}

// add counts fence, recorded on where (src), for fenced resource fenced
// of namespace ns ("" fenced: unattributed).
func (f *Floors) add(ns, fenced string, fence int64, where string, src source) {
	f.Records++
	if fence > f.Highest.Fence {
		f.Highest = grantplan.Floor{Fence: fence, Where: where}
	}
	res, _, ok := lockingv1alpha1.ParseSlotResource(fenced)
	if !ok {
		f.Unattributed++
		return
	}
	k := key(ns, res)
	m := f.byResource[k]
	if m == nil {
		m = map[string]grantplan.Floor{}
		f.byResource[k] = m
	}
	if fence > m[fenced].Fence {
		m[fenced] = grantplan.Floor{Fence: fence, Where: where}
		f.sources[k+"#"+fenced] = src
	}
}

// merge returns the higher of f's and o's floors, resource by resource,
// with o's counts and unreadable kinds.
func merge(f, o *Floors) *Floors {
	if f == nil {
		return o
	}
	out := newFloors()
	out.Highest, out.Records, out.Unattributed, out.Unreadable = f.Highest, o.Records, o.Unattributed, o.Unreadable
	if o.Highest.Fence > out.Highest.Fence {
		out.Highest = o.Highest
	}
	for _, src := range []*Floors{f, o} {
		for k, m := range src.byResource {
			dst := out.byResource[k]
			if dst == nil {
				dst = map[string]grantplan.Floor{}
				out.byResource[k] = dst
			}
			for fenced, fl := range m {
				if fl.Fence > dst[fenced].Fence {
					dst[fenced] = fl
					out.sources[k+"#"+fenced] = src.sources[k+"#"+fenced]
				}
			}
		}
	}
	return out
}

// Discovery lists the API's kinds (discovery.DiscoveryInterface does).
type Discovery interface {
	ServerPreferredResources() ([]*metav1.APIResourceList, error)
}

// Scanner scans the cluster for recorded fences; see the package doc. It
// is a manager Runnable.
type Scanner struct {
	// Discovery lists the API's kinds; Metadata lists their objects'
	// metadata.
	Discovery Discovery
	Metadata  metadata.Interface
	// Policies reads GuardPolicies, to attribute a record that names no
	// resource itself; nil: none.
	Policies client.Reader
	// Bundle reads the issuer's trust bundle, to verify the proofs of
	// records on objects not guarded now; nil: none counts.
	Bundle func(context.Context) (*fencing.TrustBundle, error)
	// Unguarded are the namespaces the guarded-write webhooks skip
	// (kube-system and the manager's own, config/webhook): a guard label
	// there went through no admission, so a record there counts only with
	// a proof that verifies.
	Unguarded []string
	// Interval is the time between scans after the first; 0 scans once.
	Interval time.Duration
	// Leader: the scan runs only on the elected leader (when the grant
	// controller does).
	Leader bool
	Log    logr.Logger

	floors atomic.Pointer[Floors]
	mu     sync.Mutex // one scan at a time
	swap   sync.Mutex // one update of floors at a time
}

// Floors returns the floors of resource in namespace ns and its slots, as
// far as the scans so far found: the grant controller's source of
// grantplan.Facts.Floors.
func (s *Scanner) Floors(ns, resource string) map[string]grantplan.Floor {
	return s.floors.Load().For(ns, resource)
}

// Current returns what the scans found so far; nil before the first ended.
func (s *Scanner) Current() *Floors { return s.floors.Load() }

// NeedLeaderElection implements manager.LeaderElectionRunnable.
func (s *Scanner) NeedLeaderElection() bool { return s.Leader }

// Start scans at once, then every Interval, until ctx ends. A failed scan
// is logged and tried again at the next interval (or in a minute when
// there is none); what earlier scans found stays in force.
func (s *Scanner) Start(ctx context.Context) error {
	for {
		start := time.Now()
		f, err := s.Scan(ctx)
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			s.Log.Error(err, "scanning guarded objects for recorded fences")
		default:
			s.Log.Info("scanned guarded objects for recorded fences", "records", f.Records, "unattributed", f.Unattributed,
				"highest", f.Highest.Fence, "highestOn", f.Highest.Where, "unreadableKinds", f.Unreadable, "took", time.Since(start).String())
		}
		next := s.Interval
		if next <= 0 {
			if err == nil {
				<-ctx.Done()
				return nil
			}
			next = time.Minute
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(next):
		}
	}
}

// Scan lists every kind once and merges what it found into the floors in
// force, which it returns. Kinds that cannot be listed (forbidden, gone)
// are skipped and named in Unreadable; it fails only when discovery does.
func (s *Scanner) Scan(ctx context.Context) (*Floors, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lists, err := s.Discovery.ServerPreferredResources()
	found := newFloors()
	var failed *discovery.ErrGroupDiscoveryFailed
	switch {
	case errors.As(err, &failed):
		for gv, e := range failed.Groups {
			found.Unreadable = append(found.Unreadable, fmt.Sprintf("%s: %v", gv, e))
		}
	case err != nil:
		return nil, fmt.Errorf("discovering the API's kinds: %w", err)
	}
	policies, err := s.policies(ctx)
	if err != nil {
		return nil, err
	}
	verify := s.verifier(ctx)
	for _, list := range lists {
		gv, err := schema.ParseGroupVersion(list.GroupVersion)
		if err != nil {
			continue
		}
		for _, r := range list.APIResources {
			if strings.Contains(r.Name, "/") || !slices.Contains(r.Verbs, "list") {
				continue
			}
			gvr := gv.WithResource(r.Name)
			if err := s.scanKind(ctx, gvr, r.Kind, policies, verify, found); err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				found.Unreadable = append(found.Unreadable, fmt.Sprintf("%s: %v", gvr.GroupResource(), err))
			}
		}
	}
	slices.Sort(found.Unreadable)
	s.swap.Lock()
	defer s.swap.Unlock()
	merged := merge(s.floors.Load(), found)
	s.floors.Store(merged)
	return merged, nil
}

// Confirm reads again the object that recorded the floor of fenced
// resource fenced (of resource in namespace ns) and returns that floor as
// it stands now: the object's record, or none (zero) when the object is
// gone, was replaced (another UID), or no longer carries a record counted
// for fenced. The floors in force are updated. The grant controller
// confirms a floor before it holds a request back for it, so that an
// object deleted since the scan (with its namespace, say, which took the
// counters too) holds nothing back, and an object restored with etcd
// counts with the record it has now.
func (s *Scanner) Confirm(ctx context.Context, ns, resource, fenced string) (grantplan.Floor, error) {
	k := key(ns, resource)
	cur := s.floors.Load()
	if cur == nil {
		return grantplan.Floor{}, nil
	}
	was := cur.byResource[k][fenced]
	src, ok := cur.sources[k+"#"+fenced]
	if !ok {
		return was, nil
	}
	var now grantplan.Floor
	o, err := s.Metadata.Resource(src.gvr).Namespace(src.ns).Get(ctx, src.name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
	case err != nil:
		return was, err
	case string(o.UID) == src.uid:
		// Judged again as the scan judges it: an object no longer
		// guarded counts only with a proof that verifies.
		policies, err := s.policies(ctx)
		if err != nil {
			return was, err
		}
		if rns, rf, fence, ok := s.recordOf(o, src.gvr, policies, s.verifier(ctx)); ok && rns == ns && rf == fenced {
			now = grantplan.Floor{Fence: fence, Where: was.Where}
		}
	}
	s.swap.Lock()
	defer s.swap.Unlock()
	latest := s.floors.Load()
	if latest.byResource[k][fenced] == now {
		return now, nil
	}
	next := *latest
	next.byResource = maps.Clone(latest.byResource)
	next.sources = maps.Clone(latest.sources)
	m := maps.Clone(latest.byResource[k])
	if now.Fence == 0 {
		delete(m, fenced)
		delete(next.sources, k+"#"+fenced)
	} else {
		m[fenced] = now
	}
	next.byResource[k] = m
	s.floors.Store(&next)
	return now, nil
}

func (s *Scanner) policies(ctx context.Context) ([]*lockingv1alpha1.GuardPolicy, error) {
	if s.Policies == nil {
		return nil, nil
	}
	var list lockingv1alpha1.GuardPolicyList
	if err := s.Policies.List(ctx, &list); err != nil {
		return nil, fmt.Errorf("listing GuardPolicies: %w", err)
	}
	out := make([]*lockingv1alpha1.GuardPolicy, len(list.Items))
	for i := range list.Items {
		out[i] = &list.Items[i]
	}
	return out, nil
}

// verifier returns the trust bundle's proof check; nil (no record on an
// object not guarded now counts) when the bundle cannot be read.
func (s *Scanner) verifier(ctx context.Context) func(fencing.Proof) (fencing.Record, error) {
	if s.Bundle == nil {
		return nil
	}
	b, err := s.Bundle(ctx)
	if err != nil || b == nil {
		s.Log.Error(err, "reading the trust bundle: records on objects not guarded now are not counted")
		return nil
	}
	return b.VerifyProof
}

// scanKind counts the records of every object of gvr, a page at a time.
func (s *Scanner) scanKind(ctx context.Context, gvr schema.GroupVersionResource, kind string, policies []*lockingv1alpha1.GuardPolicy, verify func(fencing.Proof) (fencing.Record, error), found *Floors) error {
	opts := metav1.ListOptions{Limit: pageSize}
	for {
		page, err := s.Metadata.Resource(gvr).List(ctx, opts)
		if err != nil {
			if apierrors.IsResourceExpired(err) && opts.Continue != "" {
				// The continue token expired: start over (floors only
				// rise, so counting a page twice is harmless).
				opts.Continue = ""
				continue
			}
			return err
		}
		for i := range page.Items {
			s.count(&page.Items[i], gvr, kind, policies, verify, found)
		}
		if opts.Continue = page.Continue; opts.Continue == "" {
			return nil
		}
	}
}

// count adds the record o carries, if any, to found.
func (s *Scanner) count(o *metav1.PartialObjectMetadata, gvr schema.GroupVersionResource, kind string, policies []*lockingv1alpha1.GuardPolicy, verify func(fencing.Proof) (fencing.Record, error), found *Floors) {
	ns, fenced, fence, ok := s.recordOf(o, gvr, policies, verify)
	if !ok {
		return
	}
	where := kind + " " + o.Name
	if o.Namespace != "" {
		where = kind + " " + o.Namespace + "/" + o.Name
	}
	found.add(ns, fenced, fence, where, source{gvr: gvr, ns: o.Namespace, name: o.Name, uid: string(o.UID)})
}

// recordOf returns the fence o's record counts for and the namespace and
// fenced resource it is attributed to, and false when it carries none that
// counts (fencing.CountFloor): no record, an administrator's override, a
// value admission never writes, or a record on an object not guarded now
// whose proof does not verify.
func (s *Scanner) recordOf(o *metav1.PartialObjectMetadata, gvr schema.GroupVersionResource, policies []*lockingv1alpha1.GuardPolicy, verify func(fencing.Proof) (fencing.Record, error)) (ns, fenced string, fence int64, ok bool) {
	a := o.Annotations
	raw, has := a[lockingv1alpha1.AcceptedFenceAnnotation]
	if !has {
		return "", "", 0, false
	}
	fence, signed, ok := fencing.CountFloor(fencing.RecordedFloor{
		Guarded: !slices.Contains(s.Unguarded, o.Namespace) && guardedNow(o, gvr, policies), Fence: raw, Intent: a[lockingv1alpha1.AcceptedIntentAnnotation],
		Proof: a[lockingv1alpha1.AcceptedProofAnnotation], Verify: verify,
	})
	switch {
	case !ok:
		return "", "", 0, false
	case signed != nil:
		// Attributed by what the issuer signed, never by annotations
		// anyone allowed to write the object can set.
		ns = o.Namespace
		if signed.Namespace != "" {
			ns = signed.Namespace
		}
		if !lockingv1alpha1.ValidFencedResource(signed.Resource) {
			return ns, "", fence, true
		}
		return ns, signed.Resource, fence, true
	}
	ns, fenced = Attribute(o, gvr, policies)
	return ns, fenced, fence, true
}

// guardedNow reports whether every write to o goes through admission now:
// it carries the guard label, or a GuardPolicy in Enforce mode covers it.
func guardedNow(o *metav1.PartialObjectMetadata, gvr schema.GroupVersionResource, policies []*lockingv1alpha1.GuardPolicy) bool {
	if o.Labels[lockingv1alpha1.GuardedLabel] == "true" {
		return true
	}
	for _, p := range policies {
		if p.Spec.Mode != lockingv1alpha1.ModeEnforce {
			continue
		}
		if ok, err := policy.Covers(p, gvr.Group, gvr.Resource, o.Namespace, o.Labels); err == nil && ok {
			return true
		}
	}
	return false
}

// Attribute returns the namespace and fenced resource ID that o's record
// fences: those its accepted proof names, else its resource annotation (in
// the namespace of the grant it accepted, or its own), else the resource ID
// of the first GuardPolicy that covers it and maps it to one. fenced is ""
// when none does.
func Attribute(o *metav1.PartialObjectMetadata, gvr schema.GroupVersionResource, policies []*lockingv1alpha1.GuardPolicy) (ns, fenced string) {
	a := o.Annotations
	ns = o.Namespace
	if g, _, ok := strings.Cut(a[lockingv1alpha1.AcceptedGrantAnnotation], "/"); ok && g != "" {
		ns = g
	}
	if p := a[lockingv1alpha1.AcceptedProofAnnotation]; p != "" {
		if rec, _, err := fencing.ParseProof(fencing.Proof(p)); err == nil && lockingv1alpha1.ValidFencedResource(rec.Resource) {
			if rec.Namespace != "" {
				ns = rec.Namespace
			}
			return ns, rec.Resource
		}
	}
	if r := a[lockingv1alpha1.ResourceAnnotation]; lockingv1alpha1.ValidFencedResource(r) {
		return ns, r
	}
	for _, p := range sortedPolicies(policies) {
		if ok, err := policy.Covers(p, gvr.Group, gvr.Resource, o.Namespace, o.Labels); err != nil || !ok {
			continue
		}
		if id := policy.ResourceID(p, o.Namespace, o.Name, a); id != "" {
			return ns, id
		}
	}
	return ns, ""
}

func sortedPolicies(ps []*lockingv1alpha1.GuardPolicy) []*lockingv1alpha1.GuardPolicy {
	byName := map[string]*lockingv1alpha1.GuardPolicy{}
	for _, p := range ps {
		byName[p.Name] = p
	}
	out := make([]*lockingv1alpha1.GuardPolicy, 0, len(byName))
	for _, n := range slices.Sorted(maps.Keys(byName)) {
		out = append(out, byName[n])
	}
	return out
}

// New returns a Scanner that reads the API server cfg names, GuardPolicies
// through policies, and scans every interval after the first (0: once).
func New(cfg *rest.Config, policies client.Reader, interval time.Duration, log logr.Logger) (*Scanner, error) {
	d, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the discovery client: %w", err)
	}
	m, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the metadata client: %w", err)
	}
	return &Scanner{Discovery: d, Metadata: m, Policies: policies, Interval: interval, Log: log}, nil
}
