//go:build !openblas && !cuda

package kernels

func defaultBackend() Backend { return OnHost(Go{}) }
