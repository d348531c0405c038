package v1alpha1

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestSlotResourceRoundTrip(t *testing.T) {
	for _, r := range []string{"orders", "batch/nightly", "a", strings.Repeat("a", MaxResourceLength)} {
		for k := int32(0); k < MaxPermits; k++ {
			id := SlotResource(r, k)
			if len(id) > MaxFencedResourceLength {
				t.Fatalf("SlotResource(%q, %d) is %d bytes, more than %d", r, k, len(id), MaxFencedResourceLength)
			}
			base, slot, ok := ParseSlotResource(id)
			if !ok || base != r || slot != k {
				t.Fatalf("ParseSlotResource(%q) = %q, %d, %v; want %q, %d, true", id, base, slot, ok, r, k)
			}
			if !ValidFencedResource(id) {
				t.Fatalf("ValidFencedResource(%q) = false", id)
			}
		}
	}
	if got := SlotResource("batch/nightly", 2); got != "batch/nightly#2" {
		t.Fatalf("SlotResource(batch/nightly, 2) = %q", got)
	}
	if got := SlotResource("orders", 0); got != "orders" {
		t.Fatalf("slot 0 of orders is %q, want the resource ID itself", got)
	}
}

func TestParseSlotResourceRefuses(t *testing.T) {
	for _, id := range []string{
		"", "#1", "orders#", "orders#0", "orders#01", "orders#64", "orders#100", "orders#-1", "orders#+1",
		"orders#1#2", "orders#a", "Orders#1", "orders/#1", "orders# 1",
		strings.Repeat("a", MaxResourceLength+1) + "#1",
	} {
		if _, _, ok := ParseSlotResource(id); ok {
			t.Errorf("ParseSlotResource(%q) accepted a malformed fenced resource ID", id)
		}
		if ValidFencedResource(id) {
			t.Errorf("ValidFencedResource(%q) = true", id)
		}
	}
	if ValidResourceID("orders#1") {
		t.Fatal("a slot's fenced resource ID is also a valid resource ID: slots could collide with resources")
	}
}

func TestFenceCounterNameOfSlots(t *testing.T) {
	seen := map[string]string{}
	for _, r := range []string{"orders", "orders-1", "batch/nightly", strings.Repeat("x", MaxResourceLength)} {
		for k := int32(0); k < MaxPermits; k++ {
			id := SlotResource(r, k)
			name := FenceCounterName(id)
			if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
				t.Fatalf("FenceCounterName(%q) = %q is not an object name: %v", id, name, errs)
			}
			if other, dup := seen[name]; dup {
				t.Fatalf("%q and %q share the counter %q", id, other, name)
			}
			seen[name] = id
		}
	}
}

func TestEffectivePermits(t *testing.T) {
	for _, c := range []struct{ spec, want int32 }{{0, 1}, {1, 1}, {3, 3}, {MaxPermits, MaxPermits}} {
		s := LockGrantSpec{Permits: c.spec}
		if got := s.EffectivePermits(); got != c.want {
			t.Errorf("permits %d: EffectivePermits() = %d, want %d", c.spec, got, c.want)
		}
	}
}
