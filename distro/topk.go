package distro

import "math"

// topK writes to idx (len k) the indices of the k entries of c with the
// largest magnitude, in ascending order. Ties go to the lower index, so the
// choice is the same on every machine. mag is scratch of length k. The values
// must be finite.
func topK(c []float32, idx []uint32, mag []uint32) {
	k := len(idx)
	mag = mag[:k]
	// best[0..k) sorted by magnitude descending, equal magnitudes by index
	// ascending; magnitudes compare as the bits of |v| (monotonic for
	// non-negative finite floats).
	n := 0
	for i := 0; i < len(c); i++ {
		if n == k {
			// Skip ahead to the next entry that beats the current k-th.
			if i = nextAbove(c, i, mag[k-1]); i == len(c) {
				break
			}
			n--
		}
		m := math.Float32bits(c[i]) &^ (1 << 31)
		j := n
		for j > 0 && mag[j-1] < m {
			mag[j] = mag[j-1]
			idx[j] = idx[j-1]
			j--
		}
		mag[j] = m
		idx[j] = uint32(i)
		n++
	}
	for i := 1; i < k; i++ {
		for j := i; j > 0 && idx[j] < idx[j-1]; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
}
