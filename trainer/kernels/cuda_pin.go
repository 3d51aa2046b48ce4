//go:build cuda

package kernels

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>

// Addresses travel as integers: the registration outlives the call.
static int psyche_host_register(unsigned long long p, unsigned long long bytes) {
	return (int)cuMemHostRegister((void*)p, bytes, 0);
}
static int psyche_host_unregister(unsigned long long p) { return (int)cuMemHostUnregister((void*)p); }
*/
import "C"

import (
	"fmt"
	"runtime"
	"unsafe"
)

// Pin page-locks h's memory for the device, so that Upload and Download
// into it run at the bus's speed rather than through the driver's staging
// copies (measured on an H100: the parameters up and the gradients down of a
// 1B model took 985 ms a step from ordinary memory). It is for long-lived
// buffers: a model's parameters and gradients. The registration ends when
// h's memory is no longer reachable (Go's heap does not move a large
// allocation, so the address stays valid until then). A failure leaves h
// as it was: transfers still work, at the slower speed.
func (c *CUDA) Pin(h []float32) error {
	if len(h) == 0 {
		return nil
	}
	p := uintptr(unsafe.Pointer(&h[0]))
	bytes := 4 * len(h)
	var err error
	c.run("Pin", func(x *cudaCall) {
		if st := C.psyche_host_register(C.ulonglong(p), C.ulonglong(bytes)); st != 0 {
			err = fmt.Errorf("cuMemHostRegister of %d MiB: CUresult %d", bytes>>20, int(st))
		}
	})
	if err != nil {
		return err
	}
	shared := c.cudaShared
	runtime.AddCleanup(&h[0], func(addr uintptr) {
		shared.mu.RLock()
		defer shared.mu.RUnlock()
		if shared.closed {
			return // the context, and with it the registration, is gone
		}
		shared.jobs <- cudaJob{op: "Unpin", fn: func(*cudaCall) {
			C.psyche_host_unregister(C.ulonglong(addr))
		}}
	}, p)
	return nil
}
