package fencing

// EpochBits is how many low bits of a fence count grants within one issuer
// epoch; the epoch occupies the bits above. A fence is
//
//	epoch<<EpochBits | sequence,   sequence >= 1
//
// so every fence of a later epoch is larger than every fence of an earlier
// one, and epoch 0 issues the plain sequence 1, 2, 3, ... Bumping the epoch
// is how an operator resumes after the registry was restored from an old
// snapshot: new fences jump past anything issued before, without anyone
// lowering or clearing a recorded fence. 40 bits allow about 10^12 grants
// per resource and epoch, and epochs up to 2^23-1.
const EpochBits = 40

// MaxEpoch is the largest issuer epoch.
const MaxEpoch = 1<<(63-EpochBits) - 1

// EpochOf returns the issuer epoch a fence was issued in.
func EpochOf(fence int64) int64 { return fence >> EpochBits }

// NextFence returns the fence to issue after highest, in issuer epoch
// epoch: the next in sequence when highest is of the same (or, after a
// restore, a later) epoch, else the first fence of epoch. It is always
// larger than highest.
func NextFence(highest, epoch int64) int64 {
	if EpochOf(highest) < epoch {
		return epoch<<EpochBits | 1
	}
	return highest + 1
}
