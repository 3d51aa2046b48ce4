//go:build !unix

package libp2p

import "time"

// resources is what the process has used so far; elsewhere than on unix the
// report shows zeros.
type resources struct {
	cpu     time.Duration
	faulted int64
}

func usage() resources { return resources{} }
