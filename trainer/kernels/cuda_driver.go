//go:build cuda

package kernels

import (
	"errors"
	"fmt"
	"strings"
	"unsafe"

	"gorgonia.org/cu"
	"gorgonia.org/cu/nvrtc"
)

// This file talks to the CUDA driver API and NVRTC (through
// gorgonia.org/cu); cuda_cublas.go to cuBLAS. Every method of
// cudaDriver must be called on the goroutine that opened it, which is locked
// to its OS thread with the device's primary context current (see CUDA).
//
// Importing gorgonia.org/cu makes the binary call cuInit when it starts (the
// package's init) and exit if that fails, so a -tags cuda binary needs the
// NVIDIA driver even to start.

// devPtr is a device address (CUdeviceptr).
type devPtr uint64

type cudaDriver struct {
	dev     cu.Device
	ctx     cu.CUContext
	ctxHeld bool
	blas    *cublasHandle
	mod     cu.Module
	modHeld bool
	fns     [numCUDAKernels]cu.Function
	desc    string
}

// openCUDADriver makes device ordinal's primary context current on the
// calling (locked) thread, compiles cudaSource for the device with NVRTC,
// loads the PTX and looks up the kernels, and creates a cuBLAS handle.
func openCUDADriver(ordinal int) (d *cudaDriver, err error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, fmt.Errorf("counting CUDA devices: %w", err)
	}
	if n <= ordinal {
		return nil, fmt.Errorf("no CUDA device %d (the driver sees %d)", ordinal, n)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, fmt.Errorf("getting CUDA device %d: %w", ordinal, err)
	}
	d = &cudaDriver{dev: dev}
	defer func() {
		if err != nil {
			d.close()
			d = nil
		}
	}()
	name, err := dev.Name()
	if err != nil {
		return nil, fmt.Errorf("naming CUDA device %d: %w", ordinal, err)
	}
	// The primary context is the one the CUDA runtime (which cuBLAS is built
	// on) uses for this device, so cuBLAS and the driver API share it.
	if d.ctx, err = dev.RetainPrimaryCtx(); err != nil {
		return nil, fmt.Errorf("retaining the primary context of %s: %w", name, err)
	}
	d.ctxHeld = true
	if err = cu.SetCurrentContext(d.ctx); err != nil {
		return nil, fmt.Errorf("making the context of %s current: %w", name, err)
	}
	major, minor, err := dev.ComputeCapability()
	if err != nil {
		return nil, fmt.Errorf("compute capability of %s: %w", name, err)
	}
	ptx, arch, err := compileCUDASource(major*10 + minor)
	if err != nil {
		return nil, err
	}
	if d.mod, err = cu.LoadData(ptx); err != nil {
		return nil, fmt.Errorf("loading the PTX compiled by NVRTC %s for %s into %s (driver %s): %w%s",
			nvrtcVersion(), arch, name, driverVersion(), err, ptxHint(err))
	}
	d.modHeld = true
	for k, kn := range cudaKernelNames {
		if d.fns[k], err = d.mod.Function(kn); err != nil {
			return nil, fmt.Errorf("looking up kernel %s: %w", kn, err)
		}
	}
	if d.blas, err = newCublas(); err != nil {
		return nil, err
	}
	d.desc = fmt.Sprintf("%s (compute capability %d.%d), kernels compiled by NVRTC %s for %s, driver %s",
		name, major, minor, nvrtcVersion(), arch, driverVersion())
	return d, nil
}

// compileCUDASource compiles cudaSource to PTX for the virtual architecture
// of compute capability cc (e.g. 90 for compute_90). An NVRTC older than the
// device does not know its architecture; then the newest older one it knows
// is used, and the driver compiles that PTX for the device when loading it.
func compileCUDASource(cc int) (ptx, arch string, err error) {
	var tried []string
	for _, a := range []int{cc, 90, 89, 87, 86, 80, 75, 72, 70, 61, 60, 53, 52, 50} {
		if a > cc || (a == cc && len(tried) > 0) {
			continue
		}
		arch = fmt.Sprintf("compute_%d", a)
		ptx, err = compileCUDAFor(arch)
		if err == nil {
			return ptx, arch, nil
		}
		if !errors.Is(err, nvrtc.InvalidOption) {
			return "", arch, err
		}
		tried = append(tried, arch)
	}
	return "", "", fmt.Errorf("NVRTC %s supports none of %s: %w", nvrtcVersion(), strings.Join(tried, ", "), err)
}

func compileCUDAFor(arch string) (string, error) {
	prog, err := nvrtc.CreateProgram(cudaSource, "psyche_kernels.cu")
	if err != nil {
		return "", fmt.Errorf("NVRTC: creating the program: %w", err)
	}
	defer prog.Destroy()
	if err := prog.Compile("--gpu-architecture=" + arch); err != nil {
		log, _ := prog.GetLog()
		return "", fmt.Errorf("NVRTC %s: compiling the kernels for %s: %w\n%s", nvrtcVersion(), arch, err, log)
	}
	ptx, err := prog.GetPTX()
	if err != nil {
		return "", fmt.Errorf("NVRTC: getting the PTX: %w", err)
	}
	return ptx, nil
}

func nvrtcVersion() string {
	major, minor, err := nvrtc.Version()
	if err != nil {
		return "(unknown version)"
	}
	return fmt.Sprintf("%d.%d", major, minor)
}

func driverVersion() string {
	v := cu.Version()
	if v < 0 {
		return "(unknown version)"
	}
	return fmt.Sprintf("CUDA %d.%d", v/1000, v%1000/10)
}

// ptxHint explains CUDA_ERROR_INVALID_PTX and CUDA_ERROR_UNSUPPORTED_PTX_VERSION
// (222, which gorgonia.org/cu reports as "UnknownErrorCode:222").
func ptxHint(err error) string {
	if errors.Is(err, cu.InvalidPtx) || strings.Contains(err.Error(), "UnknownErrorCode:222") {
		return " (the driver cannot load PTX from an NVRTC newer than itself: use an NVRTC no newer than the driver's CUDA version)"
	}
	return ""
}

func (d *cudaDriver) describe() string { return d.desc }

// close releases what open acquired; errors are ignored (this runs when the
// backend is done with, or after a failed open).
func (d *cudaDriver) close() {
	if d.blas != nil {
		d.blas.close()
		d.blas = nil
	}
	if d.modHeld {
		_ = d.mod.Unload()
		d.modHeld = false
	}
	if d.ctxHeld {
		_ = d.dev.ReleasePrimaryCtx()
		d.ctxHeld = false
	}
}

func (d *cudaDriver) alloc(bytes int64) (devPtr, error) {
	p, err := cu.MemAlloc(bytes)
	return devPtr(p), err
}

func (d *cudaDriver) free(p devPtr) error { return cu.MemFree(cu.DevicePtr(p)) }

// htod copies synchronously: when it returns, src may be reused.
func (d *cudaDriver) htod(dst devPtr, src unsafe.Pointer, bytes int64) error {
	return cu.MemcpyHtoD(cu.DevicePtr(dst), src, bytes)
}

// dtoh copies synchronously, after all work queued before it (kernels and
// cuBLAS calls all go to the legacy default stream) has finished; errors of
// that work are reported here.
func (d *cudaDriver) dtoh(dst unsafe.Pointer, src devPtr, bytes int64) error {
	return cu.MemcpyDtoH(dst, cu.DevicePtr(src), bytes)
}

// launch queues kernel k on the default stream with grid×block threads;
// params holds one 8-byte slot per kernel parameter.
func (d *cudaDriver) launch(k cudaKernel, grid, block int, params []uint64) error {
	ptrs := make([]unsafe.Pointer, len(params))
	for i := range params {
		ptrs[i] = unsafe.Pointer(&params[i])
	}
	return d.fns[k].Launch(grid, 1, 1, block, 1, 1, 0, cu.NoStream, ptrs)
}

// memsetZero queues clearing n float32s at p.
func (d *cudaDriver) memsetZero(p devPtr, n int64) error {
	return cu.MemsetD32(cu.DevicePtr(p), 0, n)
}

func (d *cudaDriver) memInfo() (free, total int64, err error) { return cu.MemInfo() }
