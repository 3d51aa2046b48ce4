package secagg

import "slices"

// Neighbors is SecAgg+'s masking graph: the clients u shares masks and
// secrets with, among the advertised ids. With degree k > 0 (and fewer
// than all), they are u's ⌈k/2⌉ nearest ids on each side in the ring of
// sorted ids: a symmetric graph that both the server and every client
// derive from the advertised set alone, so a round costs O(n·k) key
// agreements and shares instead of O(n²). k = 0 is every other client
// (SecAgg).
func Neighbors(ids []ID, k int, u ID) []ID {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	at := slices.Index(sorted, u)
	if at < 0 {
		return nil
	}
	n := len(sorted)
	h := (k + 1) / 2
	if k <= 0 || 2*h >= n-1 {
		out := make([]ID, 0, n-1)
		for _, v := range sorted {
			if v != u {
				out = append(out, v)
			}
		}
		return out
	}
	var out []ID
	for d := 1; d <= h; d++ {
		out = append(out, sorted[(at+d)%n], sorted[(at-d+n)%n])
	}
	slices.Sort(out)
	return slices.Compact(out)
}
