package server

import "net"

// listenLocal listens on a free port of the loopback interface.
func listenLocal() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
