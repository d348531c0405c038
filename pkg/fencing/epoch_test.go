package fencing_test

import (
	"math"
	"strings"
	"testing"

	"github.com/lockwarden/lockwarden/pkg/fencing"
)

func fenceOf(epoch, seq int64) int64 { return epoch<<fencing.EpochBits | seq }

// Every fence NextFence issues is above the recorded one and of the
// issuer's epoch, with a sequence of at least 1; where no such fence
// exists it issues none and says why.
func TestNextFence(t *testing.T) {
	const last = fencing.MaxSequence
	tests := []struct {
		name            string
		highest, epoch  int64
		want            int64
		reason          fencing.Reason
		adviceEpoch     int64 // the epoch the refusal asks for; 0: none
		adviceNoEpochOK bool  // the refusal says no epoch is left
	}{
		{name: "first fence", highest: 0, epoch: 0, want: 1},
		{name: "next in sequence", highest: 7, epoch: 0, want: 8},
		{name: "first of a new epoch", highest: 7, epoch: 1, want: fenceOf(1, 1)},
		{name: "next in a later epoch", highest: fenceOf(1, 5), epoch: 1, want: fenceOf(1, 6)},
		{name: "the last fence of an epoch is issued", highest: fenceOf(3, last-1), epoch: 3, want: fenceOf(3, last)},
		{name: "a new epoch after an exhausted one", highest: fenceOf(3, last), epoch: 4, want: fenceOf(4, 1)},
		{name: "the last fence there is", highest: math.MaxInt64 - 1, epoch: fencing.MaxEpoch, want: math.MaxInt64},
		// The issue this guards against: 3<<40|(2^40-1) + 1 is 4<<40|0, a
		// fence of epoch 4 issued while the issuer is at epoch 3.
		{name: "exhausted sequence never carries into the epoch", highest: fenceOf(3, last), epoch: 3, reason: fencing.ReasonSequenceExhausted, adviceEpoch: 4},
		{name: "a counter raised above the issuer's epoch", highest: fenceOf(2, 5), epoch: 1, reason: fencing.ReasonEpochBehind, adviceEpoch: 2},
		{name: "a counter raised to the last fence of a later epoch", highest: fenceOf(5, last), epoch: 1, reason: fencing.ReasonEpochBehind, adviceEpoch: 6},
		{name: "the int64 end, at the last epoch", highest: math.MaxInt64, epoch: fencing.MaxEpoch, reason: fencing.ReasonSequenceExhausted, adviceNoEpochOK: true},
		{name: "the int64 end, below the last epoch", highest: math.MaxInt64, epoch: 3, reason: fencing.ReasonEpochBehind, adviceNoEpochOK: true},
		{name: "an epoch above the last", highest: 0, epoch: fencing.MaxEpoch + 1, reason: fencing.ReasonInvalidSpec},
		{name: "a negative epoch", highest: 0, epoch: -1, reason: fencing.ReasonInvalidSpec},
		{name: "a negative recorded fence", highest: -5, epoch: 0, reason: fencing.ReasonInvalidSpec},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fencing.NextFence(tc.highest, tc.epoch)
			if r := fencing.ReasonOf(err); r != tc.reason {
				t.Fatalf("NextFence(%d, %d) = %d, %v; want reason %q", tc.highest, tc.epoch, got, err, tc.reason)
			}
			if tc.reason != "" {
				if got != 0 {
					t.Fatalf("a refusal issued fence %d", got)
				}
				detail := err.Error()
				if tc.adviceEpoch > 0 && !strings.Contains(detail, "spec.epoch to "+fencing.FormatFence(tc.adviceEpoch)+" or more") {
					t.Errorf("refusal %q does not ask for epoch %d", detail, tc.adviceEpoch)
				}
				if tc.adviceNoEpochOK && !strings.Contains(detail, "use another resource ID") {
					t.Errorf("refusal %q does not say the resource is used up", detail)
				}
				return
			}
			if got != tc.want || got <= tc.highest || fencing.EpochOf(got) != tc.epoch || fencing.SequenceOf(got) < 1 {
				t.Fatalf("NextFence(%d, %d) = %d (epoch %d, sequence %d), want %d", tc.highest, tc.epoch, got, fencing.EpochOf(got), fencing.SequenceOf(got), tc.want)
			}
		})
	}
}

// Whatever the recorded fence and epoch, an issued fence carries the
// issuer's epoch in its epoch bits.
func FuzzNextFence(f *testing.F) {
	f.Add(int64(0), int64(0))
	f.Add(fenceOf(3, fencing.MaxSequence), int64(3))
	f.Add(int64(math.MaxInt64), int64(fencing.MaxEpoch))
	f.Fuzz(func(t *testing.T, highest, epoch int64) {
		got, err := fencing.NextFence(highest, epoch)
		if err != nil {
			if fencing.ReasonOf(err) == "" || got != 0 {
				t.Fatalf("NextFence(%d, %d) = %d, %v", highest, epoch, got, err)
			}
			return
		}
		if got <= highest || fencing.EpochOf(got) != epoch || fencing.SequenceOf(got) == 0 {
			t.Fatalf("NextFence(%d, %d) = %d: epoch %d, sequence %d", highest, epoch, got, fencing.EpochOf(got), fencing.SequenceOf(got))
		}
	})
}

func TestEpochsAbove(t *testing.T) {
	for _, tc := range []struct {
		fence            int64
		issue, above     int64
		issueOK, aboveOK bool
	}{
		{0, 0, 1, true, true},
		{fenceOf(7, 1), 7, 8, true, true},
		{fenceOf(7, fencing.MaxSequence), 8, 8, true, true},
		{fenceOf(fencing.MaxEpoch, 1), fencing.MaxEpoch, 0, true, false},
		{math.MaxInt64, 0, 0, false, false},
	} {
		if e, ok := fencing.EpochToIssueAbove(tc.fence); e != tc.issue || ok != tc.issueOK {
			t.Errorf("EpochToIssueAbove(%d) = %d, %v; want %d, %v", tc.fence, e, ok, tc.issue, tc.issueOK)
		}
		if e, ok := fencing.EpochAbove(tc.fence); e != tc.above || ok != tc.aboveOK {
			t.Errorf("EpochAbove(%d) = %d, %v; want %d, %v", tc.fence, e, ok, tc.above, tc.aboveOK)
		}
	}
}

// A fence recorded on a guarded object is a floor: no fence at or below it
// is ever issued, whatever the counter says; the refusal names the epoch
// that issues above it.
func TestNextFenceAbove(t *testing.T) {
	const last = fencing.MaxSequence
	tests := []struct {
		name                  string
		highest, floor, epoch int64
		want                  int64
		reason                fencing.Reason
		says                  string
	}{
		{name: "no floor", highest: 7, floor: 0, epoch: 0, want: 8},
		{name: "a floor below the counter", highest: fenceOf(2, 9), floor: fenceOf(2, 5), epoch: 2, want: fenceOf(2, 10)},
		{name: "a floor just below the next fence", highest: fenceOf(2, 9), floor: fenceOf(2, 9), epoch: 2, want: fenceOf(2, 10)},
		{name: "a floor of an earlier epoch", highest: 0, floor: fenceOf(6, 40), epoch: 7, want: fenceOf(7, 1)},
		{name: "a counter lost, the floor of the issuer's epoch", highest: 0, floor: fenceOf(3, 5), epoch: 3, reason: fencing.ReasonFenceRegression, says: "spec.epoch to 4 or more"},
		{name: "a counter restored behind the floor", highest: fenceOf(3, 2), floor: fenceOf(3, 5), epoch: 3, reason: fencing.ReasonFenceRegression, says: "spec.epoch to 4 or more"},
		{name: "the next fence equals the floor", highest: fenceOf(3, 4), floor: fenceOf(3, 5), epoch: 3, reason: fencing.ReasonFenceRegression, says: "above fence " + fencing.FormatFence(fenceOf(3, 5))},
		{name: "a floor of a later epoch", highest: 0, floor: fenceOf(7, 1), epoch: 0, reason: fencing.ReasonFenceRegression, says: "spec.epoch to 8 or more"},
		{name: "a floor at the last fence of an epoch", highest: 0, floor: fenceOf(5, last), epoch: 5, reason: fencing.ReasonFenceRegression, says: "spec.epoch to 6 or more"},
		{name: "a floor of the last epoch", highest: 0, floor: fenceOf(fencing.MaxEpoch, 1), epoch: 9, reason: fencing.ReasonFenceRegression, says: "An object wedged in the last epoch"},
		{name: "the counter's own refusal comes first", highest: fenceOf(3, last), floor: fenceOf(3, 5), epoch: 3, reason: fencing.ReasonSequenceExhausted},
		{name: "an epoch behind the counter comes first", highest: fenceOf(4, 1), floor: fenceOf(9, 1), epoch: 3, reason: fencing.ReasonEpochBehind},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fencing.NextFenceAbove(tc.highest, tc.floor, tc.epoch)
			if r := fencing.ReasonOf(err); r != tc.reason {
				t.Fatalf("NextFenceAbove(%d, %d, %d) = %d, %v; want reason %q", tc.highest, tc.floor, tc.epoch, got, err, tc.reason)
			}
			if tc.reason != "" {
				if got != 0 {
					t.Fatalf("a refusal issued fence %d", got)
				}
				if !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("refusal %q does not say %q", err, tc.says)
				}
				return
			}
			if got != tc.want || got <= tc.floor || got <= tc.highest || fencing.EpochOf(got) != tc.epoch {
				t.Fatalf("NextFenceAbove(%d, %d, %d) = %d, want %d", tc.highest, tc.floor, tc.epoch, got, tc.want)
			}
		})
	}
}

// Whatever the counter, floor and epoch, an issued fence is above both.
func FuzzNextFenceAbove(f *testing.F) {
	f.Add(int64(0), fenceOf(3, 5), int64(3))
	f.Add(fenceOf(3, 9), fenceOf(3, 5), int64(3))
	f.Fuzz(func(t *testing.T, highest, floor, epoch int64) {
		got, err := fencing.NextFenceAbove(highest, floor, epoch)
		if err != nil {
			if fencing.ReasonOf(err) == "" || got != 0 {
				t.Fatalf("NextFenceAbove(%d, %d, %d) = %d, %v", highest, floor, epoch, got, err)
			}
			return
		}
		if got <= highest || got <= floor || fencing.EpochOf(got) != epoch {
			t.Fatalf("NextFenceAbove(%d, %d, %d) = %d", highest, floor, epoch, got)
		}
	})
}
