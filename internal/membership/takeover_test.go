package membership

import (
	"testing"
	"time"
)

func TestTakeover(t *testing.T) {
	const delay = 400 * time.Millisecond
	ms := func(n int) time.Time { return t0.Add(time.Duration(n) * time.Millisecond) }
	type step struct {
		at        time.Time
		preferred bool
		state     uint64
		want      time.Duration
	}
	for _, tc := range []struct {
		name    string
		maxWait time.Duration
		steps   []step
	}{
		{"the preferred replica acts at once", 0, []step{
			{ms(0), true, 1, 0}, {ms(1), true, 2, 0},
		}},
		{"another replica acts after a quiet delay", 0, []step{
			{ms(0), false, 1, delay},
			{ms(100), false, 1, 300 * time.Millisecond}, // another event, nothing moved
			{ms(400), false, 1, 0},
			{ms(401), false, 1, delay}, // a new deferral
		}},
		{"the state moving gives the preferred replica a new delay", 0, []step{
			{ms(0), false, 1, delay},
			{ms(400), false, 2, delay}, // the preferred replica wrote
			{ms(800), false, 2, 0},     // then nothing more: act (a pass that finds nothing to do)
		}},
		{"a state that keeps moving defers as long as it moves", 0, []step{
			{ms(0), false, 1, delay},
			{ms(400), false, 2, delay},
			{ms(800), false, 3, delay},
			{ms(1200), false, 4, delay},
			{ms(1600), false, 4, 0},
		}},
		{"with MaxWait, a state that keeps moving defers at most MaxWait", 3 * delay, []step{
			{ms(0), false, 1, delay},
			{ms(400), false, 2, delay},
			{ms(800), false, 3, delay},
			{ms(1000), false, 4, 200 * time.Millisecond}, // capped at first+3*delay
			{ms(1200), false, 5, 0},
		}},
		{"becoming preferred forgets the deferral", 0, []step{
			{ms(0), false, 1, delay},
			{ms(100), true, 1, 0},
			{ms(200), false, 1, delay},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tk := &Takeover{Delay: delay, MaxWait: tc.maxWait}
			for i, s := range tc.steps {
				if got := tk.Wait("ns/r", s.preferred, s.state, s.at); got != s.want {
					t.Fatalf("step %d: Wait = %s, want %s", i, got, s.want)
				}
			}
		})
	}
}

func TestTakeoverDisabled(t *testing.T) {
	tk := &Takeover{}
	if got := tk.Wait("ns/r", false, 1, t0); got != 0 {
		t.Fatalf("with no delay every replica acts at once, got %s", got)
	}
	if tk.Pending() != 0 {
		t.Fatal("a disabled takeover remembered a resource")
	}
}
